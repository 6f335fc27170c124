"""`autoglm-serve doctor`, `--version`, help texts, and scripts/run_autoglm_server.sh running
doctor with the right Python before it starts anything."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import autoglm_serve
from autoglm_serve.bench.server_process import free_port
from tests.server_fixtures import ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoglm_serve", *args], capture_output=True,
                          text=True, env=ENV, cwd=ROOT, timeout=300)


def test_doctor_passes_with_the_embedded_default():
    proc = cli("doctor", "--host", "127.0.0.1", "--port", str(free_port()))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for line in ("✓ Python 3.", "✓ torch ", "Triton", "✓ model the embedded default: llama, gguf",
                 "is free", "ready to serve"):
        assert line in out, out
    assert "✗" not in out


def test_doctor_says_whether_the_cpu_kernel_for_gguf_blocks_is_built(tmp_path):
    from autoglm_serve.kernels.cpu.gguf_block_gemm import available
    built = "✓ CPU kernel for GGUF Q4_1/Q8_0 weights built"
    assert (built in cli("doctor", "--port", str(free_port())).stdout) == available()
    # a machine without a C compiler is told how to get one, and may still serve
    proc = subprocess.run([sys.executable, "-m", "autoglm_serve", "doctor", "--port",
                           str(free_port())], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**ENV, "CC": str(tmp_path / "no-such-cc"),
                               "AUTOGLM_SERVE_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "! no C compiler or no AVX2" in proc.stdout and "install gcc" in proc.stdout


def test_doctor_fails_on_a_missing_model_and_a_busy_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = cli("doctor", str(tmp_path / "nowhere"), "--host", "127.0.0.1",
                   "--port", str(port))
    assert proc.returncode == 1, proc.stdout
    out = proc.stdout
    assert "✗ model: unknown model path" in out and "fix: give the checkpoint directory" in out
    assert f"✗ cannot listen on 127.0.0.1:{port}" in out and "ss -ltnp" in out
    assert "2 problem(s) to fix" in out


def test_doctor_names_a_checkpoint_without_weights():
    packaged = ROOT / "autoglm_serve" / "models" / "configs" / "autoglm-phone-9b"
    proc = cli("doctor", str(packaged), "--port", str(free_port()))
    assert proc.returncode == 1
    assert "Glm4vForConditionalGeneration) has config.json but no weights" in proc.stdout


def test_version_and_help_show_each_default_once():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"autoglm-serve {autoglm_serve.__version__}"
    for sub in (["serve"], ["doctor"], ["bench", "serve"], ["bench", "offline"], ["tune"]):
        text = subprocess.run([sys.executable, "-m", "autoglm_serve", *sub, "--help"],
                              capture_output=True, text=True, env={**ENV, "COLUMNS": "400"},
                              cwd=ROOT, timeout=120).stdout
        lines = [ln for ln in text.splitlines() if ln.count("(default") > 1]
        assert not lines, (sub, lines)
        assert "(default: None)" not in text, sub
    serve_help = cli("serve", "--help").stdout
    assert "(default: the embedded SmolLM2-135M-Instruct)" in serve_help


def test_run_script_uses_the_venv_python_and_stops_on_doctor(tmp_path):
    # A fake repository whose .venv python is this interpreter: the script must pick it
    # (PATH holds no python3 at all), run doctor, and stop before serving.
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / ".venv" / "bin").mkdir(parents=True)
    script = repo / "scripts" / "run_autoglm_server.sh"
    script.write_text((ROOT / "scripts" / "run_autoglm_server.sh").read_text())
    used = tmp_path / "venv-python-used"
    venv_python = repo / ".venv" / "bin" / "python"
    venv_python.write_text(f'#!/bin/sh\necho "$@" >> {used}\nexec {sys.executable} "$@"\n')
    venv_python.chmod(0o755)
    env = {**ENV, "PATH": "/usr/bin:/bin", "PORT": str(free_port())}
    env.pop("PYTHON", None)
    proc = subprocess.run(["bash", str(script), str(tmp_path / "no-model")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    calls = used.read_text()
    assert "-m autoglm_serve doctor" in calls and "autoglm_serve serve" not in calls
    assert "✗ model: unknown model path" in proc.stdout
    assert "not starting" in proc.stdout

"""`autoglm-serve bench` end to end on CPU: real servers started here, real HTTP, real CLI.

Engines: `transformers serve` on a tiny random Llama (always), and our own `autoglm-serve serve`
on the same checkpoint once it exists (skipped until then). Each test runs the bench CLI as a
subprocess, as a user would, and checks the table, the JSON and the PNG files it leaves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autoglm_serve.bench.server_process import ServerProcess, free_port
from tests.tiny_llama import build_tiny_llama

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(600)


def _transformers_cmd(model: Path, port: int) -> list[str]:
    exe = shutil.which("transformers", path=str(Path(sys.executable).parent)) or \
        shutil.which("transformers")
    if exe is None:
        pytest.skip("`transformers serve` is not installed")
    return [exe, "serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]


def _ours_available() -> bool:
    return (ROOT / "autoglm_serve" / "cli.py").exists() and \
        (ROOT / "autoglm_serve" / "server" / "launch.py").exists()


def _ours_cmd(model: Path, port: int, *extra: str) -> list[str]:
    if not _ours_available():
        pytest.skip("our server (`autoglm-serve serve`) does not exist yet")
    return [sys.executable, "-m", "autoglm_serve.cli", "serve", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--device", "cpu", "--max-model-len", "4096", *extra]


ENGINES = {"transformers": _transformers_cmd, "autoglm": _ours_cmd}


def start_server(cmd: list[str], port: int, log: Path, timeout: float = 180) -> ServerProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return ServerProcess(cmd, port, log, env=env, cwd=ROOT).start(timeout)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("bench-e2e") / "tiny-llama")


@pytest.fixture(scope="module", params=list(ENGINES))
def server(request, tiny_model, tmp_path_factory):
    port = free_port()
    cmd = ENGINES[request.param](tiny_model, port)
    srv = start_server(cmd, port, tmp_path_factory.mktemp("logs") / f"{request.param}.log")
    srv.engine = request.param
    try:
        yield srv
    finally:
        srv.stop(signal.SIGKILL)


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "autoglm_serve.bench", "bench", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def table_rows(markdown: str) -> list[list[str]]:
    lines = [ln for ln in markdown.splitlines() if ln.startswith("| ") and "---" not in ln]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]


def test_sweep_writes_table_json_and_plots(server, tiny_model, tmp_path):
    out = tmp_path / "sweep"
    proc = bench("serve", "--base-url", server.base_url, "--model", str(tiny_model),
                 "--dataset", "random", "--num-prompts", "6", "--input-len", "24",
                 "--output-len", "8", "--max-concurrency", "1,2,4", "--label", server.engine,
                 "--goodput", "ttft:60000", "tpot:10000", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The Markdown table is printed at the end, one row per concurrency level.
    rows = table_rows(proc.stdout)
    assert [r[0] for r in rows] == ["1", "2", "4"], proc.stdout
    assert all(r[1] == "6/0" for r in rows)
    assert "GPU: not measured" in proc.stdout or "GPU:" in proc.stdout
    assert (out / "summary.md").read_text().count("\n| ") >= 4

    result = json.loads((out / "results.json").read_text())
    assert result["label"] == server.engine and result["dataset"] == "random"
    assert [p["max_concurrency"] for p in result["points"]] == [1, 2, 4]
    for p in result["points"]:
        s = p["summary"]
        assert s["completed"] == 6 and s["failed"] == 0
        assert s["ttft_ms"]["mean"] > 0 and s["e2el_ms"]["p99"] >= s["e2el_ms"]["median"]
        assert s["output_throughput"] > 0 and s["goodput"] == pytest.approx(s["request_throughput"])
        assert s["max_concurrent_requests"] <= p["max_concurrency"]
        assert len(p["records"]) == 6
        for r in p["records"]:
            assert r["success"] and r["output_tokens"] == 8  # from the usage chunk
            assert r["output_tokens_source"] == "usage"
            assert r["start"] < r["chunk_times"][0] <= r["chunk_times"][-1] <= r["end"]
            assert len(r["itl_ms"]) == len(r["chunk_times"]) - 1
            assert r["ttft_ms"] == pytest.approx((r["chunk_times"][0] - r["start"]) * 1000)
    # The concurrency limit holds: at c=1 requests never overlap.
    c1 = sorted(result["points"][0]["records"], key=lambda r: r["start"])
    assert all(a["end"] <= b["start"] for a, b in zip(c1, c1[1:]))

    png = out / "latency_throughput.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    if not result["gpu"]["available"]:
        assert not (out / "gpu_timeline.png").exists()
        assert "no GPU timeline" in proc.stdout


def test_completions_endpoint_and_compare(server, tiny_model, tmp_path):
    runs = []
    for label, endpoint in (("chat", "/v1/chat/completions"), ("completions", "/v1/completions")):
        out = tmp_path / label
        proc = bench("serve", "--base-url", server.base_url + "/v1", "--endpoint", endpoint,
                     "--num-prompts", "4", "--input-len", "16", "--output-len", "6",
                     "--max-concurrency", "1,2", "--label", f"{server.engine}-{label}",
                     "--no-progress", "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(out / "results.json")
    proc = bench("compare", *map(str, runs), "--out", str(tmp_path / "cmp"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table_rows(proc.stdout)
    assert [(r[0], r[2]) for r in rows] == [
        (f"{server.engine}-chat", "1"), (f"{server.engine}-chat", "2"),
        (f"{server.engine}-completions", "1"), (f"{server.engine}-completions", "2")]
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 20_000
    assert "| run |" in (tmp_path / "cmp" / "compare.md").read_text()


def test_phone_agent_two_agents_three_steps(server, tiny_model, tmp_path):
    out = tmp_path / "agent"
    proc = bench("serve", "--base-url", server.base_url, "--model", str(tiny_model),
                 "--dataset", "phone-agent", "--agents", "2", "--steps", "3",
                 "--output-len", "8", "--max-concurrency", "2", "--label", "agent",
                 "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    (point,) = result["points"]
    agent = point["phone_agent"]
    if point["summary"]["failed"]:
        # A text-only model may refuse image parts; then the refusal must be the reported reason.
        pytest.skip(f"{server.engine} refused the screenshots: {point['summary']['failure_reasons']}")
    assert agent["agents"] == 2 and agent["steps"] == 3
    assert agent["steps_completed"] == 6 and agent["episodes_completed"] == 2
    assert agent["agent_steps_per_s"] > 0
    assert sorted(agent["mean_latency_ms_by_step"]) == ["0", "1", "2"]
    recs = point["records"]
    assert sorted((r["agent"], r["step"]) for r in recs) == [(a, s) for a in (0, 1) for s in range(3)]
    # Steps of one agent are sequential; the prompt grows step by step (history, server usage).
    for a in (0, 1):
        mine = sorted((r for r in recs if r["agent"] == a), key=lambda r: r["step"])
        assert all(x["end"] <= y["start"] for x, y in zip(mine, mine[1:]))
        assert mine[0]["prompt_len"] < mine[1]["prompt_len"] < mine[2]["prompt_len"]
    assert "agent steps/s" in proc.stdout and "2 episodes completed" in proc.stdout


def test_killed_server_is_reported_as_failures(tiny_model, tmp_path):
    """Kill the server mid-run: the bench finishes, reports failures with reasons, exits 0."""
    port = free_port()
    srv = start_server(_transformers_cmd(tiny_model, port), port, tmp_path / "server.log")
    try:
        out = tmp_path / "killed"
        env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "autoglm_serve.bench", "bench", "serve", "--base-url", srv.base_url,
             "--model", str(tiny_model), "--num-prompts", "40", "--input-len", "16",
             "--output-len", "24", "--max-concurrency", "2", "--request-timeout", "60",
             "--no-progress", "--out", str(out)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Let a few requests complete, then kill the server under the running benchmark.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and srv.log(10**7).count("POST /v1/chat") < 4:
            time.sleep(0.2)
        srv.stop(signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        srv.stop(signal.SIGKILL)
    assert proc.returncode == 0, stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    s = result["points"][0]["summary"]
    assert s["completed"] >= 1 and s["failed"] >= 1 and s["completed"] + s["failed"] == 40
    reasons = " ".join(s["failure_reasons"])
    assert any(k in reasons for k in ("ConnectError", "RemoteProtocolError", "ReadError",
                                      "stream ended")), reasons
    assert "Failures:" in stdout and "×" in stdout
    for r in result["points"][0]["records"]:
        assert r["success"] or r["error"]


def test_fail_on_error_sets_the_exit_code(tmp_path):
    """Against a dead port (no warm-up check): failures are reported; non-zero only when asked."""
    url = f"http://127.0.0.1:{free_port()}"
    common = ["serve", "--base-url", url, "--model", "m", "--num-prompts", "3", "--input-len", "4",
              "--output-len", "2", "--no-warmup", "--no-progress", "--gpu-monitor", "--label", "dead"]
    proc = bench(*common, "--out", str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 × ConnectError" in proc.stdout
    proc = bench(*common, "--out", str(tmp_path / "b"), "--fail-on-error")
    assert proc.returncode == 1
    assert "3 request(s) failed" in proc.stderr
    # With the warm-up check (default), an unreachable server is a usage error: exit 2, clear text.
    proc = bench("serve", "--base-url", url, "--model", "m", "--num-prompts", "1", "--out",
                 str(tmp_path / "c"))
    assert proc.returncode == 2 and "failed the first request" in proc.stderr


def test_request_timeout_never_hangs(tmp_path):
    """A server that accepts connections and never answers: every request times out, recorded."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # read nothing, answer nothing
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        proc = bench("serve", "--base-url", url, "--model", "m", "--num-prompts", "3",
                     "--input-len", "4", "--output-len", "2", "--request-timeout", "1.5",
                     "--no-warmup", "--no-progress", "--out", str(tmp_path / "t"))
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        thread.join()
        for s in held:
            s.close()
        listener.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "t" / "results.json").read_text())
    s = result["points"][0]["summary"]
    assert s["failed"] == 3
    assert all(("timeout" in k.lower() or "Timeout" in k) for k in s["failure_reasons"]), s
    assert elapsed < 60


def test_phone_agent_on_our_server_with_a_vision_model(tmp_path):
    """The real workload: screenshots go through our server's vision path (tiny GLM-4.1V)."""
    from tests.glm4v_fixtures import make_tiny_glm4v

    # seed 2: the greedy tokens of seeds 0 and 1 on this prompt (a random model repeating one
    # byte such as 0xF8) never form valid UTF-8, so their responses carry no text, which the
    # bench counts as failed, as vLLM's does
    model = make_tiny_glm4v(tmp_path / "tiny-glm4v", seed=2)
    port = free_port()
    # Small max_pixels keeps the tiny ViT fast on CPU; the PNG is still a full 1080x2400 upload.
    srv = start_server(_ours_cmd(model, port, "--mm-processor-kwargs",
                                 '{"max_pixels": 100000}'), port, tmp_path / "server.log",
                       timeout=300)
    try:
        out = tmp_path / "agent"
        wall_before = time.time()
        proc = bench("serve", "--base-url", srv.base_url, "--model", str(model), "--dataset",
                     "phone-agent", "--agents", "2", "--steps", "3", "--output-len", "8",
                     "--ignore-eos", "--max-concurrency", "2", "--out", str(out))
        wall_after = time.time()
    finally:
        srv.stop(signal.SIGKILL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    point = result["points"][0]
    # the run's window on the wall clock (phone_agent_bench.py selects the server's step trace
    # with it): inside the bench process's life, after the screenshots were rendered
    run_start, run_end = (result["t0_unix_s"] + point[k] for k in ("start_s", "end_s"))
    assert wall_before < run_start < run_end < wall_after
    assert all(0 <= r["start"] - point["start_s"] and r["end"] <= point["end_s"] + 1e-6
               for r in point["records"])
    assert point["summary"]["failed"] == 0, point["summary"]["failure_reasons"]
    assert point["phone_agent"]["episodes_completed"] == 2
    assert all(r["output_tokens"] == 8 for r in point["records"])

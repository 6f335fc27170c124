"""`autoglm-serve tune`: candidate grid, budget, choice of the winner, and a real end-to-end run.

The end-to-end run starts real servers through --serve-command. Until our `autoglm-serve serve`
exists, that command is a small wrapper that takes tune's flags and starts `transformers serve`
(and, to exercise the failure path, refuses chunked prefill off, as a server with an invalid
setting would). With our server present, the same run uses it directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autoglm_serve.bench import tune as tune_mod
from autoglm_serve.bench.tune import Candidate, TuneConfig, TuneTrial, candidates, trials_table
from tests.tiny_llama import build_tiny_llama

ROOT = Path(__file__).resolve().parent.parent


def test_candidate_flags_and_grid_order():
    c = Candidate(128, 8192, 0.85, False)
    assert c.serve_args() == ["--max-num-seqs", "128", "--max-num-batched-tokens", "8192",
                              "--gpu-memory-utilization", "0.85", "--no-enable-chunked-prefill"]
    cfg = TuneConfig(model="m", slo={"ttft": 1000}, max_num_seqs=[64, 256],
                     max_num_batched_tokens=[2048, 8192], chunked_prefill=[False, True])
    grid = candidates(cfg)
    assert len(grid) == 8 and len(set(grid)) == 8
    assert grid[0] == Candidate(256, 8192, 0.9, True)  # chunked on, largest first
    assert all(g.chunked_prefill for g in grid[:4])


def test_budget_and_winner(monkeypatch, tmp_path):
    """Fake trials (no servers): the budget stops the search; the best goodput meeting the SLO
    attainment wins, and a faster setting that misses the SLO does not."""
    results = {
        Candidate(256, 8192, 0.9, True): (5.0, 0.50),  # most goodput but SLO met by 50% only
        Candidate(256, 4096, 0.9, True): (3.0, 0.95),
        Candidate(64, 8192, 0.9, True): (2.0, 1.00),
    }
    clock = [0.0]

    def fake_trial(cfg, cand, log_dir):
        clock[0] += 60.0  # each try takes a minute
        good, att = results.get(cand, (1.0, 1.0))
        return TuneTrial(cand, "ok", goodput=good, attainment=att, seconds=60.0)

    monkeypatch.setattr(tune_mod, "run_trial", fake_trial)
    monkeypatch.setattr(tune_mod.time, "monotonic", lambda: clock[0])
    cfg = TuneConfig(model="m", slo={"ttft": 500}, budget_minutes=3.5, max_num_seqs=[64, 256],
                     max_num_batched_tokens=[4096, 8192], chunked_prefill=[True, False],
                     log_dir=str(tmp_path))
    best, trials = tune_mod.tune(cfg, echo=lambda *_: None)
    assert len(trials) == 3  # a fourth minute would overrun 3.5 minutes
    assert best is not None and best.candidate == Candidate(256, 4096, 0.9, True)
    table = trials_table(trials, best)
    assert table.count("\n") == 4 and "★" in table and "50%" in table
    assert tune_mod.serve_command_line(cfg, best.candidate) == (
        "autoglm-serve serve m --max-num-seqs 256 --max-num-batched-tokens 4096 "
        "--gpu-memory-utilization 0.9 --enable-chunked-prefill")


WRAPPER = textwrap.dedent("""\
    # Takes `autoglm-serve serve` flags, starts `transformers serve` (test stand-in).
    import argparse, os, sys
    p = argparse.ArgumentParser()
    p.add_argument("model"); p.add_argument("--port", type=int)
    p.add_argument("--max-num-seqs"); p.add_argument("--max-num-batched-tokens")
    p.add_argument("--gpu-memory-utilization")
    p.add_argument("--enable-chunked-prefill", action="store_true")
    p.add_argument("--no-enable-chunked-prefill", action="store_true")
    a = p.parse_args()
    if a.no_enable_chunked_prefill:
        sys.exit("error: max-num-batched-tokens is smaller than max-model-len without chunked prefill")
    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    os.execv(exe, [exe, "serve", a.model, "--host", "127.0.0.1", "--port", str(a.port),
                   "--device", "cpu"])
""")


@pytest.mark.timeout(600)
def test_tune_end_to_end(tmp_path):
    model = build_tiny_llama(tmp_path / "tiny-llama")
    ours = (ROOT / "autoglm_serve" / "cli.py").exists() and \
        (ROOT / "autoglm_serve" / "server" / "launch.py").exists()
    if ours:
        serve_cmd = None
    else:
        if not (Path(sys.executable).parent / "transformers").exists():
            pytest.skip("neither our server nor transformers serve is available")
        (tmp_path / "serve_wrapper.py").write_text(WRAPPER)
        serve_cmd = f"{sys.executable} {tmp_path / 'serve_wrapper.py'}"
    args = [sys.executable, "-m", "autoglm_serve.bench", "tune", str(model),
            "--slo", "ttft:60000,tpot:10000", "--budget-minutes", "8",
            "--max-num-seqs", "4", "--max-num-batched-tokens", "512,1024",
            "--chunked-prefill", "on,off", "--num-prompts", "3", "--input-len", "16",
            "--output-len", "4", "--max-concurrency", "2", "--startup-timeout", "120",
            "--log-dir", str(tmp_path / "logs")]
    if serve_cmd:
        args += ["--serve-command", serve_cmd]
    else:
        args += ["--serve-args", "--device cpu"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=550)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "status" not in ln
            and "---" not in ln]
    assert len(rows) == 4, out
    ok_rows = [r for r in rows if "| ok |" in r]
    assert len(ok_rows) >= 2 and all("100%" in r for r in ok_rows)
    if serve_cmd:  # the stand-in refuses chunked prefill off: reported, not fatal
        assert sum("failed to start" in r for r in rows) == 2
        assert "max-num-batched-tokens is smaller" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("autoglm-serve serve ") and "--enable-chunked-prefill" in last
    assert "--max-num-seqs 4" in last
    # Every server it started is gone.
    logs = list((tmp_path / "logs").glob("server-*.log"))
    assert len(logs) == 4

"""`autoglm-serve bench offline`: our engine through its offline API, same metrics, on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_llama import build_tiny_llama

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(importlib.util.find_spec("autoglm_serve.llm") is None,
                       reason="the offline engine (autoglm_serve/llm.py) does not exist yet"),
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("bench-offline") / "tiny-llama")


def run_offline(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "autoglm_serve.bench", "bench", "offline", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)


def test_offline_sweep(tiny_model, tmp_path):
    out = tmp_path / "offline"
    proc = run_offline(str(tiny_model), "--num-prompts", "6", "--input-len", "24",
                       "--output-len", "8", "--ignore-eos", "--max-num-seqs", "1,3",
                       "--engine-args", '{"device": "cpu"}', "--goodput", "ttft:60000",
                       "--label", "ours-offline", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 1 | 6/0 |" in proc.stdout and "| 3 | 6/0 |" in proc.stdout
    result = json.loads((out / "results.json").read_text())
    assert result["kind"] == "offline" and result["label"] == "ours-offline"
    for point in result["points"]:
        s = point["summary"]
        assert s["completed"] == 6 and s["failed"] == 0
        assert s["total_output_tokens"] == 6 * 8  # --ignore-eos: exactly --output-len each
        assert s["total_input_tokens"] == 6 * 24  # random token ids reach the engine as is
        assert s["ttft_ms"]["mean"] > 0 and s["tpot_ms"]["mean"] > 0
        assert s["itl_ms"]["count"] > 0  # the step driver timestamps every step
        assert s["goodput"] == pytest.approx(s["request_throughput"])
        assert s["max_concurrent_requests"] == 6  # all submitted at once
    # With max_num_seqs=1 requests run one after another: each one's first token comes after
    # the one before it ended (a ratio of TTFTs would depend on the first step's one-off costs).
    def first_token(r):
        return r["start"] + r["ttft_ms"] / 1e3
    c1 = sorted(result["points"][0]["records"], key=first_token)
    for before, after in zip(c1, c1[1:]):
        assert first_token(after) >= before["end"] - 1e-3
    c3 = sorted(result["points"][1]["records"], key=first_token)
    assert first_token(c3[1]) < c3[0]["end"]      # three at once: they overlap
    assert (out / "latency_throughput.png").stat().st_size > 20_000


def test_offline_generate_fallback_gives_ttft_tpot_e2el(tiny_model):
    """An engine without the step API: the driver falls back to generate() and its metrics."""
    from autoglm_serve import LLM, SamplingParams
    from autoglm_serve.bench import offline
    from autoglm_serve.bench.datasets import random_dataset
    from autoglm_serve.bench.metrics import summarize

    llm = LLM(model=str(tiny_model), device="cpu", max_num_seqs=2)
    reqs = random_dataset(3, 16, 5, tokenizer=llm.tokenizer, seed=3)
    params = [SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True) for _ in reqs]
    import time

    offset = time.perf_counter() - time.monotonic()
    outputs = llm.generate([r.prompt_token_ids for r in reqs], params)
    records = offline._records_from_outputs(outputs, reqs, offset)
    s = summarize(records, duration_s=1.0)
    assert s.completed == 3 and s.total_output_tokens == 15
    assert s.ttft_ms.count == 3 and s.tpot_ms.count == 3 and s.itl_ms.count == 0
    for r in records:
        assert r.start <= r.chunk_times[0] <= r.end

"""scripts/gpu/fp8_gemm_sweep.py --smoke runs every part of the GPU script on CPU (Triton
interpreter, tiny shapes, partial tiles), so the H200 run does not fail on a typo, and the
split-K GEMM agrees with _scaled_mm there."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_fp8_gemm_sweep_smoke_runs():
    r = subprocess.run([sys.executable, "scripts/gpu/fp8_gemm_sweep.py", "--smoke"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert {(row["shape"], row["m"]) for row in rows} == {
        (s, m) for s in ("qkv", "down") for m in (40, 70)}
    for row in rows:
        assert row["configs_wrong"] == [] and row["split_k_config"] is not None, row
        assert row["bf16_us"] > 0 and row["scaled_mm_us"] > 0, row
    assert "0 configs disagreed with _scaled_mm" in r.stdout
    # a TUNED entry per (rows bucket, shape)
    assert r.stdout.count("(64, 96, 160): ") == 1 and r.stdout.count("(128, 64, 300): ") == 1

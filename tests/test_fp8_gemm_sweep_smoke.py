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
        (s, m) for s in ("qkv", "gate_up", "down") for m in (3, 40, 70)}
    for row in rows:
        assert row["configs_wrong"] == [] and row["split_k_config"] is not None, row
        assert row["bf16_us"] > 0 and row["scaled_mm_us"] > 0, row
        # the FP8 GEMV's rows: its time and the quantization the GEMM would add
        assert (row["m"] == 3) == ("fp8_gemv_us" in row) == ("quantize_us" in row), row
        assert ("silu_quantize_us" in row) == (row["m"] == 3 and row["shape"] == "gate_up")
    assert "0 configs disagreed with _scaled_mm" in r.stdout
    # a TUNED entry per (rows bucket, shape) past the GEMV's rows
    assert r.stdout.count("(64, 96, 160): ") == 1 and r.stdout.count("(128, 64, 300): ") == 1
    assert "(16, 96, 160): " not in r.stdout


def test_tuned_table_shares_configs_within_three_percent():
    """Each shape gets a config near its best from as few distinct configs as cover them all,
    and None where the best does not beat _scaled_mm by 3%."""
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    from fp8_gemm_sweep import tuned_table

    def row(m, n, tried, scaled_mm):
        best = min(tried.values())
        return {"shape": f"s{n}", "m": m, "n": n, "k": 64, "scaled_mm_us": scaled_mm,
                "split_k_best_us": best, "tried": tried}
    a, b, c = "(16, 64, 128, 4, 4, 4)", "(32, 64, 256, 2, 4, 3)", "(64, 64, 256, 1, 4, 3)"
    rows = [row(16, 96, {a: 10.0, b: 10.2, c: 12.0}, 15.0),     # a best, b near
            row(32, 96, {a: 11.0, b: 10.0}, 15.0),              # b only
            row(64, 96, {c: 9.0, b: 9.2}, 13.0),                # c best, b near
            row(128, 96, {c: 13.2}, 13.5)]                      # not 3% faster
    lines = tuned_table(rows)
    assert lines[0].startswith("    (16, 96, 64): GemmConfig(32, 64, 256, 2, 4, 3),")
    assert lines[1].startswith("    (32, 96, 64): GemmConfig(32, 64, 256, 2, 4, 3),")
    assert lines[2].startswith("    (64, 96, 64): GemmConfig(32, 64, 256, 2, 4, 3),")
    assert lines[3].startswith("    (128, 96, 64): None,")

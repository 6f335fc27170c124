"""scripts/gpu/silu_quant_bench.py --smoke runs the GPU script's whole path on CPU (Triton
interpreter, tiny rows, a partial tile), so the device call does not fail on a typo, and every
tile it times gives the two kernels' codes and scales bit for bit there."""
import json

from gpu_script_smoke import run_smoke


def test_silu_quant_bench_smoke_runs():
    out = run_smoke("silu_quant_bench.py")
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [row["rows"] for row in rows] == [3, 5]
    for row in rows:
        for name in ("two_kernels", "engine", "two_pass_8192x16", "one_tile_8w", "one_tile_16w",
                     "one_tile_32w"):
            assert isinstance(row[name], float) and row[name] > 0, (name, row)
    assert "0 variants differed from the two kernels" in out

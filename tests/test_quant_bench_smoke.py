"""scripts/gpu/quant_bench.py --smoke runs every part of the GPU script on CPU (tiny GLM-4.1V,
tiny shapes), so the H200 run does not fail on a typo."""
from gpu_script_smoke import run_smoke


def test_quant_bench_smoke_runs():
    out = run_smoke("quant_bench.py", "--modes", "w4a16_fp8kv", timeout=400)
    assert '"kind": "error"' not in out
    assert "| down 128x256 | 16 | w4a16_zp |" in out and "kernels/wna16.py TUNED" in out
    w4 = [line for line in out.splitlines() if line.startswith("| w4a16_fp8kv |")]
    assert w4 and "| - |" not in w4[0], out[-2000:]

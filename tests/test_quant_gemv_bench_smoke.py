"""scripts/gpu/quant_gemv_bench.py --smoke runs every part of the GPU script on CPU (Triton
interpreter, tiny shapes), so the H200 run does not fail on a typo."""
import json

from gpu_script_smoke import run_smoke


def test_quant_gemv_bench_smoke_runs(tmp_path):
    out = tmp_path / "bench.json"
    # the current kernel stands in for --baseline (an earlier copy of it on the H200)
    stdout = run_smoke("quant_gemv_bench.py", "--out", str(out), "--baseline",
                       "autoglm_serve/kernels/w4a16_gemv.py")
    assert "WRONG" not in stdout and "failed" not in stdout, stdout[-3000:]
    assert "0 configs disagreed" in stdout
    assert "paste into autoglm_serve/kernels/w4a16_gemv.py" in stdout
    result = json.loads(out.read_text())
    assert {(rec["shape"], rec["m"]) for rec in result["records"]} == {
        (s, m) for s in ("gate_up+silu", "qkv") for m in (1, 3, 32)}
    for rec in result["records"]:
        assert rec["w4a16_gemv"] and rec["w4a16_gemv_before"], rec
        # the FP8 GEMV takes up to 8 rows; above 16 the W4A16 one's peer is the engine's
        # dequantize-then-cuBLAS, which the table compares it with
        assert bool(rec["fp8_gemv"]) == (rec["m"] <= 8), rec
        assert ("w4a16_dequant_cublas" in rec) == (rec["m"] > 16), rec
    assert "W4 GEMV before" in stdout
    assert "('gated', 32, 24, 256, 128): " in stdout and "dequantize + cuBLAS" in stdout
    assert len(result["large_m"]) == 2

"""scripts/gpu/quant_gemv_bench.py --smoke runs every part of the GPU script on CPU (Triton
interpreter, tiny shapes), so the H200 run does not fail on a typo."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quant_gemv_bench_smoke_runs(tmp_path):
    out = tmp_path / "bench.json"
    # the current kernel stands in for --baseline (an earlier copy of it on the H200)
    r = subprocess.run([sys.executable, "scripts/gpu/quant_gemv_bench.py", "--smoke", "--out",
                        str(out), "--baseline", "autoglm_serve/kernels/w4a16_gemv.py"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WRONG" not in r.stdout and "failed" not in r.stdout, r.stdout[-3000:]
    assert "0 configs disagreed" in r.stdout
    assert "paste into autoglm_serve/kernels/w4a16_gemv.py" in r.stdout
    result = json.loads(out.read_text())
    assert {(rec["shape"], rec["m"]) for rec in result["records"]} == {
        (s, m) for s in ("gate_up+silu", "qkv") for m in (1, 3)}
    for rec in result["records"]:
        assert rec["w4a16_gemv"] and rec["fp8_gemv"] and rec["w4a16_gemv_before"], rec
    assert "W4 GEMV before" in r.stdout
    assert len(result["large_m"]) == 2

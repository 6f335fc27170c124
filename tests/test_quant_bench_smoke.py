"""scripts/gpu/quant_bench.py --smoke runs every part of the GPU script on CPU (tiny GLM-4.1V,
tiny shapes), so the H200 run does not fail on a typo."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quant_bench_smoke_runs():
    r = subprocess.run([sys.executable, "scripts/gpu/quant_bench.py", "--smoke", "--modes", "w4a16_fp8kv"],
                       capture_output=True, text=True, cwd=ROOT, timeout=400,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert '"kind": "error"' not in r.stdout
    assert "| down 128x256 | 16 | w4a16_zp |" in r.stdout and "kernels/wna16.py TUNED" in r.stdout
    w4 = [line for line in r.stdout.splitlines() if line.startswith("| w4a16_fp8kv |")]
    assert w4 and "| - |" not in w4[0], r.stdout[-2000:]

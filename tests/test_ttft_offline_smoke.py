"""scripts/gpu/ttft_offline.py --smoke runs every part of the GPU script on CPU (tiny GLM-4.1V,
small screenshots): both scheduler variants time their turns and are profiled."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ttft_offline_smoke_runs():
    r = subprocess.run([sys.executable, "scripts/gpu/ttft_offline.py", "--smoke",
                        "--min-chunk-before-image", "0,256"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    for v in (0, 256):
        assert f"min chunk before an image {v}: TTFT median" in r.stdout, r.stdout[-2000:]
        assert f"min chunk {v}, profiled: wall" in r.stdout

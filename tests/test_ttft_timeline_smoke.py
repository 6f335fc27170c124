"""scripts/gpu/ttft_timeline.py --smoke runs the GPU script's whole path on CPU (a tiny GLM-4.1V
server, three screenshot steps): each step's TTFT split by the step trace and by the server's
own /metrics histograms, which must describe the same request."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ttft_timeline_smoke_runs(tmp_path):
    r = subprocess.run([sys.executable, "scripts/gpu/ttft_timeline.py", "--smoke",
                        "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| median |" in r.stdout, r.stdout[-2000:]
    rows = json.loads((tmp_path / "ttft_timeline.json").read_text())["rows"]
    assert len(rows) == 3
    for row in rows:
        # the server's TTFT runs from the request's arrival, after the client sent it
        assert 0 < row["server_ttft_ms"] < row["ttft_ms"], row
        assert 0 <= row["queue_ms"] < row["server_ttft_ms"], row
        assert row["to_engine_ms"] > 0, row

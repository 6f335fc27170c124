"""scripts/gpu/ttft_timeline.py --smoke runs the GPU script's whole path on CPU (a tiny GLM-4.1V
server, three screenshot steps): each step's TTFT split by the step trace and by the server's
own /metrics histograms, which must describe the same request."""
import json

from gpu_script_smoke import run_smoke


def test_ttft_timeline_smoke_runs(tmp_path):
    out = run_smoke("ttft_timeline.py", "--out", str(tmp_path))
    assert "| median |" in out, out[-2000:]
    rows = json.loads((tmp_path / "ttft_timeline.json").read_text())["rows"]
    assert len(rows) == 3
    for row in rows:
        # the server's TTFT runs from the request's arrival, after the client sent it
        assert 0 < row["server_ttft_ms"] < row["ttft_ms"], row
        assert 0 <= row["queue_ms"] < row["server_ttft_ms"], row
        assert row["to_engine_ms"] > 0, row

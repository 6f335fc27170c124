"""scripts/gpu/ttft_timeline.py --smoke runs the GPU script's whole path on CPU (a tiny GLM-4.1V
server, three screenshot steps): each step's TTFT split by the step trace and by the server's
own /metrics histograms, which must describe the same request, and the trace's parts add up
to the client's TTFT."""
import importlib.util
import json

import pytest
from gpu_script_smoke import ROOT, run_smoke


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
        parts = [row[k] for k in ("before_ms", "vision_ms", "prompt_ms", "after_ms")]
        assert min(parts) >= 0 and row["vision_ms"] + row["prompt_ms"] > 0, row
        assert abs(sum(parts) - row["ttft_ms"]) < 1e-3, row


def test_async_steps_are_charged_until_the_next_line_completes_them():
    """With async scheduling a step's line is written once it is launched; the line after it
    waited for it on the device, so its work ends there (the prompt's last chunk, and so the
    first token, included)."""
    spec = importlib.util.spec_from_file_location("ttft_timeline", ROOT / "scripts/gpu/ttft_timeline.py")
    timeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline)
    line = dict(sync_ms=None, encoder_tokens=0, prompt_tokens=0)
    steps = [dict(line, t=10.100, ms=5.0, encoder_tokens=900),     # launches the vision tower
             dict(line, t=10.160, ms=60.0, prompt_tokens=800),     # waited for the tower
             dict(line, t=10.190, ms=30.0, decode_rows=1),         # waited for the prompt
             dict(line, t=10.195, ms=5.0, decode_rows=1)]
    parts = timeline.attribute(steps, sent=10.0, first=10.200)
    assert parts["before_ms"] == pytest.approx(95.0)     # to the first line's start
    assert parts["vision_ms"] == pytest.approx(65.0)     # its start to the prompt line, which completed it
    assert parts["prompt_ms"] == pytest.approx(30.0)     # until the decode line completed it
    assert parts["after_ms"] == pytest.approx(10.0)
    assert parts["work_steps"] == 2 and parts["steps"] == 4
    # the same steps synced: each line is its own step's end
    synced = [dict(s, sync_ms=1.0) for s in steps]
    parts = timeline.attribute(synced, sent=10.0, first=10.200)
    assert (parts["vision_ms"], parts["prompt_ms"]) == (pytest.approx(5.0), pytest.approx(60.0))
    assert parts["after_ms"] == pytest.approx(40.0)

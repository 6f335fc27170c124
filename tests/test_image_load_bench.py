"""scripts/image_load_bench.py runs and reports every screenshot it was given."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests/data/phone_screenshot_1080x2400.png"


def test_image_load_bench_times_each_form_and_file():
    r = subprocess.run([sys.executable, "scripts/image_load_bench.py", "--repeats", "1",
                        "--screens", "1", str(SAMPLE)], capture_output=True, text=True,
                       cwd=ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    figures = report["image_load"]
    assert list(figures) == ["screen 0, Open-AutoGLM's form", "screen 0, RGB level 1",
                             SAMPLE.name]
    assert figures[SAMPLE.name]["bytes"] == SAMPLE.stat().st_size
    assert all(f["ms"] > 0 for f in figures.values()) and len(report["load_average"]) == 3

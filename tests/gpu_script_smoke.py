"""Runs a GPU script's --smoke mode (scripts/gpu/*.py on CPU: the Triton interpreter, tiny
shapes or a tiny model) in its own process, with the environment a device call gives it, so a
typo fails here and not in an H200 call. Returns its standard output."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_smoke(script: str, *args: str, timeout: int = 300) -> str:
    r = subprocess.run([sys.executable, f"scripts/gpu/{script}", "--smoke", *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    return r.stdout

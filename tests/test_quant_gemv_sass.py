"""The quantized GEMVs' default configs compiled for sm_90 on CPU (scripts/quant_gemv_sass.py):
no spills, and few instructions per weight in the K loop, since at decode the instruction issue
rate, not HBM, bounds a kernel that spends many (~6 per weight is about the H200's HBM rate for
int4). A subprocess: the compiler, not the interpreter the other tests run."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parent.parent


def test_default_configs_compile_lean_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # W4A16: one row on CUDA cores (plain and gated: scale and zero factored out of each
    # word's sum), more rows on tensor cores, one row in bf16 pairs, a sum a word or two
    # words (their PTX assembles);
    # FP8: one row on CUDA cores, e4m3 tensor cores, one row in f16 pairs (four words a sum);
    # W8A16 (a byte is 1 B against int4's 0.5, so about twice the budget a weight): one row on
    # CUDA cores, 16 rows gated on tensor cores
    r = subprocess.run([sys.executable, "scripts/quant_gemv_sass.py", "w4", "1,128,128,2,0,0",
                        "w4", "1,128,128,2,0,1", "w4", "16,128,128,2,1,1", "w4s",
                        "1,128,128,2,0,1", "fp8", "1,16,512,1,0,0", "fp8", "16,128,256,2,1,0",
                        "w4s", "1,128,128,2,2,1", "w4", "1,128,128,2,2,0",
                        "w4s", "1,256,128,2,3,1", "fp8", "1,8,512,1,4,1",
                        "w8", "1,64,128,2,0,0", "w8", "16,64,128,2,1,1"],
                       cwd=ROOT, env={
                            **env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 12, r.stdout
    for line, most in zip(lines, (4.8, 4.3, 4.6, 4.3, 4.5, 2.0, 3.4, 4.2, 2.9, 3.0, 6.5, 6.0)):
        assert " 0 bytes local" in line, line             # no spills
        per_weight = float(re.search(r"= ([\d.]+) per weight", line).group(1))
        assert 0 < per_weight < most, line
    # the W4A16 tensor-core tile is one MMA: its weights cross shared memory once (a product
    # per nibble plane took 32 barriers and 16 fences a gated tile)
    barriers = int(re.search(r"barriers (\d+)", lines[2]).group(1))
    fences = int(re.search(r"memory fences (\d+)", lines[2]).group(1))
    assert barriers <= 6 and fences == 0, lines[2]
    barriers = int(re.search(r"barriers (\d+)", lines[11]).group(1))
    assert barriers <= 6, lines[11]

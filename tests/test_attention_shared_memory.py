"""The paged attention kernels, compiled for the 24 GB cards our users run (sm_86 RTX 3090 /
A10, sm_89 RTX 4090 / L4: 99 KB of shared memory a program) with the tiles and pipeline depth
tuned on an H200 (227 KB), need no more than those cards have: a kernel over the limit fails at
its first launch there; and the prefill's TMA variant compiles for Hopper. A subprocess: the
compiler, not the interpreter the other tests run."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parent.parent
LIMIT_99_KB = 99 * 1024


def _shared_memory_needs(archs: str) -> dict[tuple[str, str], int]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "scripts/attention_shared_memory.py", "--arch", archs],
                       cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return {tuple(line.split()[:2]): int(line.split()[2]) for line in r.stdout.splitlines()}


def test_attention_kernels_fit_a_24gb_cards_shared_memory():
    needs = _shared_memory_needs("86,89")
    kernels = ("decode", "decode-1-row", "prefill")
    assert set(needs) == {(f"sm_{a}", k) for a in (86, 89) for k in kernels}
    for (arch, kernel), nbytes in needs.items():
        # more than a single K/V tile's 16 KB: the pipeline's buffers are there
        assert 16 * 1024 < nbytes <= LIMIT_99_KB, f"{arch} {kernel}: {nbytes} bytes"


def test_prefill_tma_variant_compiles_for_hopper():
    # the TMA boxes exist from sm_90 on: the kernel with them compiles there (the interpreter
    # tests run its logic) and fits a Hopper program's 227 KB
    needs = _shared_memory_needs("90")
    assert ("sm_90", "prefill-tma") in needs
    assert 16 * 1024 < needs["sm_90", "prefill-tma"] <= 227 * 1024

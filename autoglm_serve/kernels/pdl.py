"""Programmatic dependent launch (PDL) for the decode-path kernels, on Hopper and newer.

A decode step at batch 1 is ~330 small kernels back to back, and normally each one is launched
only once the one before it has fully drained. Launched with PDL, a kernel's launch is prepared
while its predecessor runs, and its programs start as soon as the predecessor's last program
exits; each then waits in ``griddepcontrol.wait`` until the predecessor's writes are visible.

The contract for a kernel with a ``PDL`` constexpr: call ``wait_for_previous_grid(PDL)`` before
any load of data another kernel writes and before any store. Ordering stays transitive: the next
kernel waits for this one, which waited for its own predecessor.

The decode kernels signal their dependents (``let_dependents_launch``, griddepcontrol.
launch_dependents) once each program has issued its last load of a large operand: after a
GEMV's K loop, the decode attention's context loop, the norm's loads. The next kernel's programs
then take SM slots as this one's drain, and wait in ``wait_for_previous_grid`` as before; the
signal changes when a kernel may start, never what it reads. Signalling first thing was slower
(dependents held SM slots the running kernel's tail could use: a batch-1 step 187.5 -> 179
tok/s, batch 8 1,424 -> 1,083 on the H200). After the loads, median decode step at 512 tokens
of context (scripts/gpu/decode_trace.py), the implicit signal at exit -> after the loads:
FP8 3.47 -> 3.37 ms at 1 row, 3.87 -> 3.82 at 8, 3.99 -> 3.92 at 16 (H200), and 4.22 -> 4.15,
4.77 -> 4.74, 4.88 -> 4.85 (H100); bf16 6.46 -> 6.41 at 1 row and level at 8 and 16 (H100);
W4A16 3.15 -> 3.07 at 1 row (H200), 3.52 -> 3.45 (H100). W4A16 at 16 rows lost: 6.55 -> 6.71
(H200) with every kernel signalling, and on the H100 6.72 -> 6.89 that way, 6.78-6.89 with the
W4A16 GEMV's tensor-core path (2-16 rows) signalling at exit, as it now does. BENCHMARKS.md.

``launch_options(device)`` gives the kernel's flag and the launch keyword; off on CPU, under the
Triton interpreter, before Hopper, and with ``AUTOGLM_PDL=0``.
"""
from __future__ import annotations

import os
from functools import lru_cache

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@lru_cache(maxsize=None)
def _supported(device_index: int) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("AUTOGLM_PDL") == "0":
        return False
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def enabled(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    return _supported(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(device: torch.device) -> dict:
    """Keyword arguments for a launch of a kernel with a ``PDL`` constexpr."""
    on = enabled(device)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def wait_for_previous_grid(PDL: tl.constexpr):
    """Returns once the kernel before this one has finished and its writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def let_dependents_launch(PDL: tl.constexpr):
    """Past this program's last load: the next kernel may launch (and wait in its own
    ``wait_for_previous_grid``) once every program of this one has called this or exited."""
    if PDL:
        gdc_launch_dependents()

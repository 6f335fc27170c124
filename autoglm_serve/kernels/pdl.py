"""Programmatic dependent launch (PDL) for the decode-path kernels, on Hopper and newer.

A decode step at batch 1 is ~330 small kernels back to back, and normally each one is launched
only once the one before it has fully drained. Launched with PDL, a kernel's launch is prepared
while its predecessor runs, and its programs start as soon as the predecessor's last program
exits; each then waits in ``griddepcontrol.wait`` until the predecessor's writes are visible.

The contract for a kernel with a ``PDL`` constexpr: call ``wait_for_previous_grid(PDL)`` before
any load of data another kernel writes and before any store. Ordering stays transitive: the next
kernel waits for this one, which waited for its own predecessor.

None of our kernels signals its dependents early (``griddepcontrol.launch_dependents``): on the
H200, dependents that start early and wait hold SM slots that the running kernel's tail could use;
signalling first thing took a batch-1 step from 187.5 to 179 tok/s and batch 8 from 1,424 to
1,083 tok/s, where the implicit signal at exit gives 194 and 1,469 (BENCHMARKS.md).

``launch_options(device)`` gives the kernel's flag and the launch keyword; off on CPU, under the
Triton interpreter, before Hopper, and with ``AUTOGLM_PDL=0``.
"""
from __future__ import annotations

import os
from functools import lru_cache

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait


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

"""Programmatic dependent launch (PDL) for the decode-path kernels, on Hopper and newer.

A decode step at batch 1 is ~330 small kernels back to back. Normally each one starts only once
the one before it has fully drained, so every boundary costs the launch and ramp-up of the next
grid with the GPU half idle. A kernel launched with PDL may be scheduled while its predecessor's
last programs still run; it then waits in ``griddepcontrol.wait`` until that predecessor has
finished and its writes are visible, and only then touches what the predecessor wrote.

The contract for a kernel with a ``PDL`` constexpr: call ``launch_next_grid(PDL)`` first, then
``wait_for_previous_grid(PDL)`` before any load of data another kernel writes and before any
store; only reads of data no kernel writes (weights) may come between the two. Launching the next
grid early is safe: its own wait still waits for this grid's completion, and a grid counts as
launched-from only once all its programs are resident, so waiting programs never hold back one
that has not started.

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
    return {"PDL": on, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def launch_next_grid(PDL: tl.constexpr):
    """Lets the next kernel be scheduled into the SMs this grid's last programs leave free."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def wait_for_previous_grid(PDL: tl.constexpr):
    """Returns once the kernel before this one has finished and its writes are visible."""
    if PDL:
        gdc_wait()

"""torch's CPU thread pool for the engine, the same in every entry point (server core process,
server thread, offline LLM): one thread per core but one, unless OMP_NUM_THREADS says.

torch's own default, one thread per core, stalls whenever anything else runs: each op waits for
its slowest thread, and a thread that lost its core holds the op up for a scheduler slice. On a
2-core machine with one other busy process, `LLM().generate` of 2 x 16 tokens took 39-44 s with
torch's default and 1.7 s with one thread; the spare core also serves the HTTP front-end.
"""
from __future__ import annotations

import os

import torch


def engine_threads() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) - 1)


def size_cpu_threads(device: torch.device) -> None:
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(engine_threads())

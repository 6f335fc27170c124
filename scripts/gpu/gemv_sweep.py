"""What the GEMV benchmarks (gemv_bench.py, quant_gemv_bench.py) share: timing calls in CUDA
graphs over enough weight copies that L2 holds none of a launch's weights, as in the 40-layer
step, and the split-K values worth sweeping."""
from __future__ import annotations

import math
import statistics
import time

import torch

L2_BYTES = 50 << 20
GRAPH_SECONDS = 2e-3        # aim for ~2 ms of GEMMs per graph replay
REPLAYS = 7


def use_interpreter_fixes() -> None:
    """For a --smoke run on CPU: the tests' work-arounds for the Triton interpreter's bugs
    (tests/triton_interpreter_fixes.py), applied for the whole process, and one torch thread."""
    import os
    import sys
    import types
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "tests"))
    from triton_interpreter_fixes import fix_interpreter
    fix_interpreter(types.SimpleNamespace(setattr=setattr))
    torch.set_num_threads(1)


def copies_past_l2(nbytes: int) -> int:
    """Weight copies to cycle through so that their sum is 3 x L2 (at least 2)."""
    return max(2, math.ceil(3 * L2_BYTES / nbytes))


def time_calls(calls: list, est_seconds: float, smoke: bool = False) -> float:
    """Seconds per call: a CUDA graph launching the calls round-robin, replayed REPLAYS times
    (smoke: one wall-clock call)."""
    for call in calls:
        call()                        # compile, allocate workspaces: outside the capture
    if smoke:
        t0 = time.perf_counter()
        calls[0]()
        return time.perf_counter() - t0
    per_graph = len(calls) * max(1, math.ceil(GRAPH_SECONDS / est_seconds / len(calls)))
    per_graph = min(per_graph, max(len(calls), 400))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(per_graph):
            calls[i % len(calls)]()
    graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / per_graph)
    del graph
    return statistics.median(times)


def splits_for(tiles: int, chunks: int) -> list[int]:
    """Split-K only while the tiles alone are few for 132 SMs: 128..1024 programs, >= 2 K
    chunks per split."""
    if tiles >= 512:
        return [1]
    return [s for s in (1, 2, 4, 8) if 128 <= tiles * s <= 1024 and chunks >= 2 * s]

"""A JSON line per engine step (`serve --step-trace PATH`): where a served workload's time goes.

The periodic log line gives a step's mean and slowest per interval; a trace gives every step:
when it ended (wall clock, so a client's run windows select its steps), how long the core took
over it, and what it carried: decode rows, prompt tokens and the prompts they came from, the
vision tower's share in token-equivalents, and the queue after it. With async scheduling a
step's time is mostly the wait for the one before it to finish on the device, so on a busy GPU
it is that step's device time. The launch's CPU time on the core's thread tells Python work from
blocking: an eager prompt step's launch is CPU (~20-30 ms of it on the H100 machine's CPU, the
BENCHMARKS.md of 2026-12-07), and where that is longer than the step before it on the device,
the device waits for the host. On a GPU a line also counts the caching allocator's cudaFree
calls and retries during the step: each frees cached blocks and synchronizes the device, so a
step that launches into a full cache waits there for everything queued before it; and its
cudaMalloc calls and the pinned host allocator's new blocks, which may wait for the device
too. With AUTOGLM_SLOW_LAUNCH_MS, a launch over that long also gets its sampled stacks
(engine/launch_sampler.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch


@dataclass
class StepRecord:
    """What one batched step of the core did, and the host's seconds in each of its parts."""
    scheduled: object              # SchedulerOutput
    encoder_tokens: int            # the vision tower's blocks, in token-equivalents
    encode_s: float                # running them (launches, unless something syncs)
    schedule_s: float
    launch_s: float                # the step's inputs and launches (and its update)
    launch_cpu_s: float            # of which this thread's CPU time: the rest it was blocked
    wait_s: float                  # completing the step before: mostly the wait for the device
    sync_s: float | None           # completing this step at once (None: left in flight)
    launch_stacks: dict | None = None   # the launch's sampled stacks, if slow (launch_sampler.py)


def step_rows(record: StepRecord | None) -> tuple[int, int, int]:
    """(decode rows, prompt tokens, prompts) of the step just run: read right after it, while
    each request's num_computed_tokens already counts the step's tokens and no later ones."""
    decode_rows = prompt_tokens = prompts = 0
    for s in record.scheduled.scheduled if record is not None else ():
        if s.request.num_computed_tokens - s.num_new_tokens >= s.request.num_prompt_tokens:
            decode_rows += 1
        else:
            prompts += 1
            prompt_tokens += s.num_new_tokens
    return decode_rows, prompt_tokens, prompts


class StepTrace:
    def __init__(self, path: str):
        self._file = open(path, "a", buffering=1)   # line-buffered: readable while it runs
        self._counters: dict[str, float] = {}

    def _allocator_calls(self) -> dict:
        """Since the last line: the device allocator's cudaFree calls and retries (each
        synchronizes the device) and its cudaMalloc calls, and the pinned host allocator's
        new blocks and the milliseconds their allocation took (a new pinned block is
        page-locked and mapped for the device: it may wait for the device too). None off a
        GPU."""
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        device = torch.cuda.memory_stats()
        now = {"device_frees": device.get("num_device_free", 0),
               "alloc_retries": device.get("num_alloc_retries", 0),
               "device_allocs": device.get("num_device_alloc", 0)}
        host_stats = getattr(torch.cuda, "host_memory_stats", None)     # not in older torch
        if host_stats is not None:
            host = host_stats()
            now["host_allocs"] = host.get("num_host_alloc", 0)
            now["host_alloc_ms"] = host.get("host_alloc_time.total", 0) / 1e3
        deltas = {k: v - self._counters.get(k, 0) for k, v in now.items()}
        self._counters = now
        if "host_alloc_ms" in deltas:
            deltas["host_alloc_ms"] = round(deltas["host_alloc_ms"], 3)
        return deltas

    def step_done(self, core, seconds: float) -> None:
        record = core.last_step
        decode_rows, prompt_tokens, prompts = step_rows(record)
        line = {"t": round(time.time(), 6), "ms": round(1e3 * seconds, 3),
                "decode_rows": decode_rows, "prompt_tokens": prompt_tokens, "prompts": prompts,
                "running": core.num_running, "waiting": core.num_waiting}
        if record is not None:
            line.update(encoder_tokens=record.encoder_tokens,
                        encode_ms=round(1e3 * record.encode_s, 3),
                        schedule_ms=round(1e3 * record.schedule_s, 3),
                        launch_ms=round(1e3 * record.launch_s, 3),
                        launch_cpu_ms=round(1e3 * record.launch_cpu_s, 3),
                        wait_ms=round(1e3 * record.wait_s, 3),
                        sync_ms=None if record.sync_s is None else round(1e3 * record.sync_s, 3))
            if record.launch_stacks is not None:
                line["launch_stacks"] = record.launch_stacks
        line.update(self._allocator_calls())
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()

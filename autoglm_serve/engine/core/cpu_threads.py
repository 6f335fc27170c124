"""torch's CPU thread pool for the engine, the same in every entry point (server core process,
server thread, offline LLM): every core while the others are idle, one fewer for each core that
other processes keep busy, re-decided between engine steps. OMP_NUM_THREADS, when set, fixes
the count.

Why adaptive (SmolLM2 bf16 on 2 cores, offline decode, 1 / 16 streams): on a quiet machine 2
threads decode 43 / 290 tok/s, one 32 / 215; next to a busy process 2 threads fall to 1-10 / 10-
100 and one keeps 7-32 / 50-210 (each op waits for its slowest thread, and a thread that lost
its core holds the op up for a scheduler slice; `LLM().generate` of 2 x 16 tokens once took
39-44 s instead of 1.7 s). torch's libgomp waiting passively (OMP_WAIT_POLICY=PASSIVE, read as
torch loads) softens the stall (14-29 tok/s at 1 stream) but halves 2 threads on a quiet
machine (19 / 168: each op then wakes a sleeping thread), so the spin-then-sleep default stays.

The signal: the CPU time that other processes took on this process's cores since the last
decision, i.e. /proc/stat's busy time on those cores less this process's own CPU time. The
server's front-end process stays far under TAKEN_SHARE (~0.015 of a core at 1 and at 16
streams). Read every DECIDE_EVERY_S at most (~0.1 ms a reading); torch.set_num_threads between
steps is cheap and applies to the next ops of the thread that steps the engine (the core
process's or thread's loop, or the offline LLM's caller).
"""
from __future__ import annotations

import logging
import math
import os
import resource
import time
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

DECIDE_EVERY_S = 0.5
# a core counts as taken when others used more than this share of it over the window: daemons
# and a front-end's short bursts stay under it, a busy neighbour (which gets ~0.9 of a core
# even while we run one thread per core) does not
TAKEN_SHARE = 0.25
# more threads only after this many calm windows in a row, fewer at once: a wrong step up stalls
# decode 5-20x until the next decision, a wrong step down costs it ~1.4x
CALM_WINDOWS_TO_GROW = 2
# a longer window spans a time the engine sat idle: what others ran then (a benchmark client
# starting up: ~1 core for 1-2 s before its requests) says nothing about now, so it is dropped
STALE_WINDOW_S = 2.0
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def engine_threads() -> int:
    """The count to start from, before any measurement: a core left free, as before."""
    return max(1, usable_cores() - 1)


def threads_for(others_cores: float, cores: int) -> int:
    """Threads to run with when other processes used `others_cores` cores' worth of time."""
    return max(1, min(cores, math.floor(cores - others_cores + TAKEN_SHARE)))


@dataclass
class CpuReading:
    busy_s: float       # all processes' CPU time on our cores, since boot
    own_s: float        # this process's CPU time (all its threads)
    at: float           # monotonic seconds

    @classmethod
    def now(cls) -> "CpuReading":
        cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        busy_ticks = 0
        with open("/proc/stat") as stat:
            for line in stat:
                name, *fields = line.split()
                if name in cpus:
                    # user nice system idle iowait irq softirq steal (guest is inside user)
                    t = [int(x) for x in fields[:8]]
                    busy_ticks += t[0] + t[1] + t[2] + t[5] + t[6] + t[7]
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return cls(busy_ticks * _TICK_S, usage.ru_utime + usage.ru_stime, time.monotonic())

    def others_cores(self, before: "CpuReading") -> float:
        """Cores' worth of CPU time other processes took between `before` and this reading."""
        elapsed = self.at - before.at
        others = (self.busy_s - before.busy_s) - (self.own_s - before.own_s)
        return max(0.0, others / elapsed) if elapsed > 0 else 0.0


class AdaptiveThreads:
    """Call `adjust()` between steps from the thread that runs them."""

    def __init__(self):
        self.cores = usable_cores()
        self.threads = engine_threads()
        torch.set_num_threads(self.threads)
        self._last = CpuReading.now()
        self._calm = 0      # windows in a row that had room for more threads

    def adjust(self) -> None:
        window = time.monotonic() - self._last.at
        if window < DECIDE_EVERY_S:
            return
        reading = CpuReading.now()
        if window > STALE_WINDOW_S:
            self._last = reading
            return
        others = reading.others_cores(self._last)
        self._last = reading
        wanted = self.decide(others)
        if wanted != self.threads:
            logger.debug("CPU threads %d -> %d: other processes used %.2f cores",
                         self.threads, wanted, others)
            self.threads = wanted
            torch.set_num_threads(wanted)

    def decide(self, others_cores: float) -> int:
        """The count after a window in which other processes used `others_cores` cores."""
        wanted = threads_for(others_cores, self.cores)
        self._calm = self._calm + 1 if wanted > self.threads else 0
        if wanted > self.threads and self._calm < CALM_WINDOWS_TO_GROW:
            return self.threads
        return wanted


def cpu_threads(device: torch.device) -> AdaptiveThreads | None:
    """The engine's adaptive pool, or None: on a GPU, or with OMP_NUM_THREADS, whose count is
    applied again here (code in this process may have changed torch's since torch read it, and
    a fixed count is what float results that must not change with the load rely on)."""
    if device.type != "cpu":
        return None
    if _fixed_threads() is not None or not os.path.exists("/proc/stat"):
        size_cpu_threads(device)    # nothing to adapt to, or nothing to measure it with
        return None
    return AdaptiveThreads()


def _fixed_threads() -> int | None:
    """OMP_NUM_THREADS's count (its first level, as in "4,2"), or None when unset or unreadable."""
    value = os.environ.get("OMP_NUM_THREADS")
    if value is None:
        return None
    try:
        return max(1, int(value.split(",")[0]))
    except ValueError:
        return None


def size_cpu_threads(device: torch.device) -> None:
    """A fixed count, for one-shot jobs whose float sums should not depend on the load
    (quantize/pipeline.py): a core left free, or OMP_NUM_THREADS's count."""
    if device.type == "cpu":
        torch.set_num_threads(_fixed_threads() or engine_threads())

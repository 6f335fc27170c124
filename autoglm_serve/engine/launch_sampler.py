"""Where the core thread is during a slow launch: its Python stack, sampled, for the step trace.

Served prompt steps that replay the piecewise graphs launch in a median 9-13 ms of the core
thread's CPU on an H100 machine, yet 2-3% of them take 31-79 ms with the device idle behind
them, and those make nearly all the steps over 40 ms left at a decoding budget of 768
(BENCHMARKS.md, fortieth session). The step trace says how long, not where. With
``AUTOGLM_SLOW_LAUNCH_MS=N`` beside ``--step-trace``, a watcher thread samples the core
thread's stack every 2 ms once a launch has run N ms, and the step's line gets the stacks it
saw, most frequent first, with the number of samples: far fewer samples than the launch's
length allows means the thread held the GIL in one long native call (a device synchronization
spinning, say), whose frame is then the one sampled after it.

Off by default: while on, every launch wakes the watcher once (two thread switches a step).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter

ENV = "AUTOGLM_SLOW_LAUNCH_MS"
INTERVAL_S = 0.002
INNER, OUTER = 8, 6  # frames kept of a deep stack: innermost, outermost
TOP = 3             # stacks reported a launch
# torch's module-call plumbing, between every module and its forward: skipped
PLUMBING = frozenset({"_call_impl", "_wrapped_call_impl"})


def from_env() -> LaunchSampler | None:
    value = os.environ.get(ENV)
    return LaunchSampler(float(value) / 1e3) if value else None


def stack_summary(frame, until=None, inner: int = INNER, outer: int = OUTER) -> str:
    """'file.py:line function' for each frame below the one running code object ``until``
    (the launch's caller), innermost first; of a deep stack the ``inner`` innermost and the
    ``outer`` outermost: what runs, and which part of the launch it is in."""
    parts = []
    while frame is not None and frame.f_code is not until:
        code = frame.f_code
        if code.co_name not in PLUMBING:
            parts.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    if len(parts) > inner + outer:
        parts = parts[:inner] + ["..."] + parts[-outer:]
    return " < ".join(parts)


class LaunchSampler:
    def __init__(self, threshold_s: float, interval_s: float = INTERVAL_S):
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._launches = 0          # launches begun
        self._launch = 0            # the one under way (0: none)
        self._started = 0.0
        self._target = 0            # the launching thread's ident
        self._caller = None         # the code that called begin(): stacks stop there
        self._counts: Counter[str] = Counter()
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="launch-sampler", daemon=True)
        self._thread.start()

    def begin(self) -> None:
        """Called by the launching thread as its launch starts."""
        with self._lock:
            self._launches += 1
            self._launch = self._launches
            self._target = threading.get_ident()
            self._caller = sys._getframe(1).f_code
            self._counts = Counter()
            self._started = time.perf_counter()
        self._wake.set()

    def end(self) -> dict | None:
        """Called as the launch ends: its sampled stacks, or None if it ended before the
        threshold."""
        with self._lock:
            self._launch = 0
            counts = self._counts
        if not counts:
            return None
        return {"samples": sum(counts.values()),
                "stacks": [[stack, n] for stack, n in counts.most_common(TOP)]}

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join()

    def _watch(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            with self._lock:
                launch, started = self._launch, self._started
            if not launch:
                continue
            time.sleep(max(0.0, started + self.threshold_s - time.perf_counter()))
            while not self._closed:
                with self._lock:
                    if self._launch != launch:
                        break
                    frame = sys._current_frames().get(self._target)
                    if frame is not None:
                        self._counts[stack_summary(frame, self._caller)] += 1
                    del frame
                time.sleep(self.interval_s)

"""The time Python's garbage collector pauses this process, summed from ``gc.callbacks``: for
the engine's log line and the host-step profile (a full pass over a big heap stalls a step)."""
from __future__ import annotations

import gc
import time


class GcTimer:
    def __init__(self):
        self.seconds = 0.0          # collector time since the last take()
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def take(self) -> float:
        """The seconds since the last take (or the start), and starts counting again."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)

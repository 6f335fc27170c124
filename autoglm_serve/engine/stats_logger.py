"""The engine's periodic log line while it works (vLLM's "Avg prompt throughput ..." line): what a
server's operator reads to see whether requests queue, steps stall, the cache fills or Python's
garbage collector pauses the process."""
from __future__ import annotations

import logging
import time

from autoglm_serve.engine.gc_timer import GcTimer

logger = logging.getLogger("autoglm_serve.engine")


class StatsLogger:
    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._start = time.monotonic()
        self._steps = 0
        self._step_s = 0.0
        self._slowest_s = 0.0
        self._prompt0 = self._gen0 = None
        self._last_end = self._start
        self._gc = GcTimer()

    def close(self) -> None:
        self._gc.close()

    def step_done(self, core, step_s: float, prompt_tokens_before: int) -> None:
        """After each step: counts it, and logs once an interval has passed since the last line.
        An idle engine logs nothing; the interval after idling starts with its first step."""
        now = time.monotonic()
        if self._prompt0 is None or now - step_s - self._last_end > self.interval_s:
            self._start = now - step_s
            self._steps, self._step_s, self._slowest_s = 0, 0.0, 0.0
            self._gc.take()
            self._prompt0, self._gen0 = prompt_tokens_before, core.num_generation_tokens_total
        self._last_end = now
        self._steps += 1
        self._step_s += step_s
        self._slowest_s = max(self._slowest_s, step_s)
        elapsed = now - self._start
        if elapsed < self.interval_s:
            return
        # the prompt counter counts a request when it is added, not when its prefill runs
        prompt = core.num_prompt_tokens_total - self._prompt0
        gen = core.num_generation_tokens_total - self._gen0
        logger.info("engine: %d steps (mean %.1f ms, slowest %.1f ms), prompts in %.0f tok/s, "
                    "generation %.0f tok/s, running %d, waiting %d, KV cache %.0f%%, GC %.0f ms",
                    self._steps, 1e3 * self._step_s / self._steps, 1e3 * self._slowest_s,
                    prompt / elapsed, gen / elapsed, core.num_running, core.num_waiting,
                    100 * core.kv.usage, 1e3 * self._gc.take())
        self._start = now
        self._steps, self._step_s, self._slowest_s = 0, 0.0, 0.0
        self._prompt0, self._gen0 = core.num_prompt_tokens_total, core.num_generation_tokens_total

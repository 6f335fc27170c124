"""The engine's statistics, wherever the core runs: facts fixed at start-up (EngineInfo, for
the start-up report, /v1/models and /metrics), live counters (CoreStats, small enough to travel
with every output batch of a core process), the periodic log line while it works (vLLM's "Avg
prompt throughput ..." line: whether requests queue, steps stall, the cache fills), and the time
Python's garbage collector pauses the process (a full pass over a big heap stalls a step).
"""
from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass

logger = logging.getLogger("autoglm_serve.engine")


@dataclass(frozen=True)
class EngineInfo:
    model_path: str
    model_class: str
    device: str                 # "cpu", "cuda:0"
    dtype: str                  # "bfloat16"
    weight_bytes: int
    load_seconds: float
    max_model_len: int
    vocab_size: int
    max_num_seqs: int
    kv_blocks: int
    kv_block_size: int
    kv_bytes_per_block: int
    has_encoder_cache: bool
    core_pid: int               # the process stepping the core
    quantization: str = "none"  # the linear layers' method, in words
    kv_cache_dtype: str = "auto"

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.kv_block_size

    @property
    def kv_bytes(self) -> int:
        return self.kv_blocks * self.kv_bytes_per_block


@dataclass(frozen=True)
class CoreStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    num_preemptions: int = 0
    encoder_queries: int = 0
    encoder_hits: int = 0


def engine_info(core) -> EngineInfo:
    loaded, cache = core.loaded, core.cache
    return EngineInfo(
        model_path=str(loaded.resolved.path), model_class=type(loaded.model).__name__,
        device=str(core.device), dtype=str(loaded.dtype).removeprefix("torch."),
        weight_bytes=loaded.weight_bytes, load_seconds=loaded.load_seconds,
        max_model_len=core.max_model_len, vocab_size=core.vocab_size,
        max_num_seqs=core.config.max_num_seqs, kv_blocks=cache.num_blocks,
        kv_block_size=cache.block_size, kv_bytes_per_block=cache.bytes_per_block,
        has_encoder_cache=core.runner.encoder_cache is not None, core_pid=os.getpid(),
        quantization=loaded.quantization, kv_cache_dtype=str(core.runner.kv_dtype).removeprefix("torch."))


def core_stats(core) -> CoreStats:
    kv, encoder = core.kv, core.runner.encoder_cache
    return CoreStats(
        num_running=core.num_running, num_waiting=core.num_waiting, kv_usage=kv.usage,
        prompt_tokens_total=core.num_prompt_tokens_total,
        generation_tokens_total=core.num_generation_tokens_total,
        prefix_queries=kv.prefix_queries, prefix_hits=kv.prefix_hits,
        num_preemptions=core.scheduler.num_preemptions,
        encoder_queries=encoder.hits + encoder.misses if encoder is not None else 0,
        encoder_hits=encoder.hits if encoder is not None else 0)


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

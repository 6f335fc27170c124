"""What the server reads about the engine core, wherever the core runs: facts fixed at start-up
(EngineInfo, for the start-up report, /v1/models and /metrics) and live counters (CoreStats,
small enough to travel with every output batch of a core process)."""
from __future__ import annotations

import os
from dataclasses import dataclass


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

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.kv_block_size


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
        has_encoder_cache=core.runner.encoder_cache is not None, core_pid=os.getpid())


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

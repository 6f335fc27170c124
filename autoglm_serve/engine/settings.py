"""What the engine runs with, resolved once from the EngineConfig: the checkpoint (its path,
format and HF config) and the limits that follow from config and model together.

Built by whoever starts an engine (the offline LLM, the server's AsyncLLM) and handed whole to
the front-end and the core, in this process or the core's own: the model path is looked up and
the limits computed once, and both sides see the same values.
"""
from __future__ import annotations

from dataclasses import dataclass

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.core.model_setup import resolve, text_config
from autoglm_serve.loader.model_path import ResolvedModel


@dataclass(frozen=True)
class EngineSettings:
    config: EngineConfig
    model: ResolvedModel
    max_model_len: int
    max_num_batched_tokens: int
    vocab_size: int

    @property
    def hf_config(self):
        return self.model.config


def resolve_settings(config: EngineConfig, model: ResolvedModel | None = None) -> EngineSettings:
    """model: the checkpoint when already resolved (weights already loaded). Raises on
    settings that cannot work, before anything is loaded."""
    model = model or resolve(config)
    max_model_len, max_num_batched_tokens = _limits(config, model.config)
    if config.tensor_parallel_size > 1:
        from autoglm_serve.engine.parallel.distributed import check_shardable
        check_shardable(model.config, config.tensor_parallel_size, config.mm_encoder_tp_mode)
    return EngineSettings(config, model, max_model_len, max_num_batched_tokens,
                          text_config(model.config).vocab_size)


def _limits(config: EngineConfig, hf_config) -> tuple[int, int]:
    """max_model_len and max_num_batched_tokens for this config and model."""
    tcfg = text_config(hf_config)
    max_model_len = min(config.max_model_len or tcfg.max_position_embeddings,
                        tcfg.max_position_embeddings)
    if config.max_model_len and config.max_model_len > tcfg.max_position_embeddings:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                         f"max_position_embeddings={tcfg.max_position_embeddings}")
    max_num_batched_tokens = config.max_num_batched_tokens or (
        max(2048, config.max_num_seqs) if config.enable_chunked_prefill else max_model_len)
    if not config.enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        raise ValueError(f"without chunked prefill, max_num_batched_tokens "
                         f"({max_num_batched_tokens}) must be >= max_model_len "
                         f"({max_model_len})")
    return max_model_len, max_num_batched_tokens

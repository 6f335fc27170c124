"""What the engine runs with, resolved once from the EngineConfig: the checkpoint (its path,
format and HF config) and the limits that follow from config and model together.

Built by whoever starts an engine (the offline LLM, the server's AsyncLLM) and handed whole to
the front-end and the core, in this process or the core's own: the model path is looked up and
the limits computed once, and both sides see the same values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.core.model_setup import resolve, text_config
from autoglm_serve.loader.model_path import ResolvedModel


# a server's step budget when none is given (default_step_tokens says why)
SERVER_STEP_TOKENS = 2048


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


def resolve_settings(config: EngineConfig, model: ResolvedModel | None = None,
                     offline: bool = False) -> EngineSettings:
    """model: the checkpoint when already resolved (weights already loaded). offline: for the
    offline API (larger steps by default, as vLLM's LLM class). Raises on settings that cannot
    work, before anything is loaded."""
    model = model or resolve(config)
    max_model_len, max_num_batched_tokens = _limits(config, model.config, offline)
    if config.tensor_parallel_size > 1:
        from autoglm_serve.engine.parallel.distributed import check_shardable
        check_shardable(model.config, config.tensor_parallel_size, config.mm_encoder_tp_mode)
    return EngineSettings(config, model, max_model_len, max_num_batched_tokens,
                          text_config(model.config).vocab_size)


def _limits(config: EngineConfig, hf_config, offline: bool) -> tuple[int, int]:
    """max_model_len and max_num_batched_tokens for this config and model."""
    tcfg = text_config(hf_config)
    max_model_len = min(config.max_model_len or tcfg.max_position_embeddings,
                        tcfg.max_position_embeddings)
    if config.max_model_len and config.max_model_len > tcfg.max_position_embeddings:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                         f"max_position_embeddings={tcfg.max_position_embeddings}")
    max_num_batched_tokens = config.max_num_batched_tokens or (
        max(default_step_tokens(config, offline), config.max_num_seqs)
        if config.enable_chunked_prefill else max_model_len)
    if not config.enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        raise ValueError(f"without chunked prefill, max_num_batched_tokens "
                         f"({max_num_batched_tokens}) must be >= max_model_len "
                         f"({max_model_len})")
    return max_model_len, max_num_batched_tokens


def default_step_tokens(config: EngineConfig, offline: bool) -> int:
    """max_num_batched_tokens when not given. The offline API on a GPU takes vLLM's LLM-class
    defaults: 16,384 on a card of 70 GiB or more other than an A100 (vLLM found larger steps
    slower there), else 8,192. Offline only throughput counts, and a prompt step costs the
    host ~40 ms of launches whatever its size (9B, H200, BENCHMARKS.md): at 2,048 tokens an
    FP8 model's device waits for the host. A server keeps 2,048 (vLLM's below 70 GiB; it
    takes 8,192 above): a step's prompt chunks and images hold every decode in it, and the
    phone-agent workload bounds that time. A CPU keeps 2,048: its steps are compute."""
    if not offline:
        return SERVER_STEP_TOKENS
    device = config.resolve_device()
    if device.type != "cuda":
        return 2048
    props = torch.cuda.get_device_properties(device)
    return offline_gpu_step_tokens(props.total_memory, props.name)


def offline_gpu_step_tokens(total_memory: int, name: str) -> int:
    return 16384 if total_memory >= 70 * 2**30 and "a100" not in name.lower() else 8192

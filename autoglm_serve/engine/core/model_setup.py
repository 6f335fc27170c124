"""From EngineConfig to a model on its device with its weights, config and tokenizer."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from autoglm_serve.config import EngineConfig
from autoglm_serve.loader import (initialize_dummy_weights, iter_gguf_weights,
                                  iter_safetensors_weights, resolve_model_path)
from autoglm_serve.loader.hf_overrides import apply_hf_overrides
from autoglm_serve.loader.model_path import ResolvedModel
from autoglm_serve.models.layers.cpu_gguf_linear import use_gguf_block_linears
from autoglm_serve.models.layers.cpu_int4_linear import cpu_int4_available, use_int4_where_4bit
from autoglm_serve.models.layers.cpu_onednn_linear import (onednn_linear_available,
                                                            use_onednn_linears)
from autoglm_serve.models.layers.linear import get_linear_method
from autoglm_serve.models.registry import resolve_model_class
from autoglm_serve.quantization.checkpoint_tensors import convert_checkpoint_tensors
from autoglm_serve.quantization.config import resolve_quant_config
from autoglm_serve.quantization.install import (install_linear_methods,
                                                process_weights_after_loading)
from autoglm_serve.quantization.vision_fp8 import quantize_vision_tower

logger = logging.getLogger(__name__)

# Architectures shipped with the package: served with dummy weights when no checkpoint is given.
BUILTIN_CONFIGS = {"autoglm-phone-9b": Path(__file__).resolve().parents[2] / "models" / "configs"
                   / "autoglm-phone-9b"}


def is_builtin(path: Path) -> bool:
    return any(path.resolve() == p.resolve() for p in BUILTIN_CONFIGS.values())


@dataclass
class LoadedModel:
    model: nn.Module
    hf_config: object
    resolved: ResolvedModel
    device: torch.device
    dtype: torch.dtype
    weight_bytes: int
    load_seconds: float
    quantization: str = "none"      # what the linear layers run, in words


def resolve(config: EngineConfig) -> ResolvedModel:
    name = config.model
    if name is not None and name.lower() in BUILTIN_CONFIGS and not Path(name).exists():
        resolved = resolve_model_path(BUILTIN_CONFIGS[name.lower()])
    else:
        resolved = resolve_model_path(name, config.mmproj, config.revision, config.download_dir,
                                      weights=config.load_format != "dummy")
    if resolved.format == "dir-config-only" and config.load_format != "dummy":
        raise ValueError(f"{resolved.path} has a config but no weights: give a checkpoint "
                         "directory, or load_format='dummy' for random weights")
    if config.load_format == "gguf" and resolved.format != "gguf":
        raise ValueError(f"load_format='gguf' but {resolved.path} is not a GGUF file")
    if config.load_format == "safetensors" and resolved.format != "safetensors":
        raise ValueError(f"load_format='safetensors' but {resolved.path} has no safetensors")
    apply_hf_overrides(resolved.config, config.hf_overrides)
    return resolved


def text_config(hf_config):
    """The decoder's config (multimodal configs nest it)."""
    return getattr(hf_config, "text_config", None) or hf_config


def generation_config(resolved: ResolvedModel) -> dict:
    """The checkpoint's generation_config.json ({} without one)."""
    path = resolved.path / "generation_config.json" if resolved.path.is_dir() else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else {}


def generation_defaults(gen_config: dict) -> dict:
    """Sampling defaults from a generation config (requests override them); max_new_tokens is
    the default max_tokens (as in vLLM)."""
    keys = ("temperature", "top_p", "top_k", "repetition_penalty", "min_p", "max_new_tokens")
    return {k: gen_config[k] for k in keys if k in gen_config}


def load_model(settings, device: torch.device) -> LoadedModel:
    """settings: the EngineSettings (engine/settings.py), whose checkpoint is already
    resolved."""
    start = time.monotonic()
    config, resolved = settings.config, settings.model
    hf_config = resolved.config
    model_cls = resolve_model_class(hf_config)
    dtype = config.resolve_dtype(text_config(hf_config), device)
    qconfig = resolve_quant_config(hf_config, config.quantization,
                                   dummy=config.load_format == "dummy")
    if qconfig is not None and resolved.format == "gguf" and not qconfig.quantize_at_load:
        raise ValueError(f"{qconfig.method} checkpoints are safetensors, not GGUF files")
    linear_method = get_linear_method(None if qconfig is None else qconfig.method)
    with torch.device(device):
        model = model_cls(hf_config, linear_method=linear_method, dtype=dtype)
    if qconfig is not None:
        install_linear_methods(model, qconfig, dtype)
    if config.load_format == "dummy":
        initialize_dummy_weights(model, seed=config.seed)
    elif resolved.format == "gguf":
        model.load_weights(iter_gguf_weights(resolved.path, resolved.mmproj))
    else:
        weights = iter_safetensors_weights(resolved.path)
        model.load_weights(weights if qconfig is None
                           else convert_checkpoint_tensors(weights, qconfig))
    process_weights_after_loading(model)
    described = "none" if qconfig is None else qconfig.describe()
    if (qconfig is None and device.type == "cpu" and dtype == torch.bfloat16
            and cpu_int4_available()):
        if converted := use_int4_where_4bit(model):
            described += f"; {converted} linears already 4-bit: int4 CPU kernel for decode"
    if qconfig is None and device.type == "cpu" and dtype == torch.float32:
        # GGUF blocks first; oneDNN takes the linears (and LM head) that are not blocks
        taken = use_gguf_block_linears(model)
        if any(taken.values()):
            described += "; " + ", ".join(f"{count} {name}" for name, count in taken.items()
                                          if count) + " linears read as GGUF blocks"
        if onednn_linear_available() and (moved := use_onednn_linears(model)):
            described += f"; {moved} float32 linears through oneDNN"
    if config.mm_encoder_quantization == "fp8":
        if not hasattr(model, "visual"):
            raise ValueError("mm_encoder_quantization='fp8' needs a model with a vision tower")
        quantize_vision_tower(model.visual)
        described += "; vision tower FP8 W8A8"
    model.eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return LoadedModel(model, hf_config, resolved, device, dtype, weight_bytes,
                       time.monotonic() - start, described)

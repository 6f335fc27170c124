"""A built model's linear layers get their methods by name (ignore list, per-module schemes),
load through the format conversion, and are finished once their weights are in."""
from __future__ import annotations

import logging
from collections import Counter

import torch
from torch import nn

from autoglm_serve.models.layers.linear import LinearBase, UnquantizedLinearMethod
from autoglm_serve.quantization.config import QuantConfig, WeightScheme
from autoglm_serve.quantization.fp8 import Fp8LinearMethod
from autoglm_serve.quantization.wna16 import WNA16LinearMethod

logger = logging.getLogger(__name__)

# our fused layers -> the checkpoint modules they are made of
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def method_for(scheme: WeightScheme | None, qconfig: QuantConfig, dtype: torch.dtype):
    if scheme is None:
        return UnquantizedLinearMethod()
    if scheme.kind == "fp8":
        return Fp8LinearMethod(qconfig.quantize_at_load, dtype)
    return WNA16LinearMethod(scheme, dtype)


def scheme_of_layer(qconfig: QuantConfig, name: str) -> WeightScheme | None:
    """A fused layer's parts must agree (one matmul, one format); a checkpoint that stores it
    fused (GLM's gate_up_proj) names it whole."""
    parent, _, leaf = name.rpartition(".")
    parts = FUSED_PARTS.get(leaf)
    if parts is None:
        return qconfig.scheme_for(name)
    schemes = {p: qconfig.scheme_for(f"{parent}.{p}") for p in parts}
    if len(set(schemes.values())) > 1:
        raise ValueError(f"{name} fuses {', '.join(parts)}, which the quantization config "
                         f"treats differently ({schemes}); they must share one scheme")
    whole = qconfig.scheme_for(name)
    part = next(iter(schemes.values()))
    # a fused checkpoint tensor is named by the fused name: an entry for it decides
    return whole if whole != qconfig.default else part


def install_linear_methods(model: nn.Module, qconfig: QuantConfig, dtype: torch.dtype) -> None:
    counts: Counter = Counter()
    for name, module in model.named_modules():
        if isinstance(module, LinearBase):
            scheme = scheme_of_layer(qconfig, name)
            with torch.device(_device_of(model)):
                module.set_linear_method(method_for(scheme, qconfig, dtype))
            counts[scheme.describe() if scheme else "unquantized"] += 1
    logger.info("quantization %s; linear layers: %s; vision tower and lm_head: %s",
                qconfig.describe(), dict(counts), "16-bit")


def process_weights_after_loading(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, LinearBase):
            module.linear_method.process_weights_after_loading(module)


def _device_of(model: nn.Module) -> torch.device:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device
    return torch.device("cpu")

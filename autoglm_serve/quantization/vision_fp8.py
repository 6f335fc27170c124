"""``--mm-encoder-quantization fp8``: the vision tower's linear layers in FP8 W8A8 (per-channel
weight scales, dynamic per-token activations), quantized once its 16-bit weights are loaded.
Off by default: the tower is ~0.9 B parameters and quality-sensitive; on a phone screenshot it
runs ~12k-token GEMMs, where FP8's ~2x tensor-core rate is the gain. The patch embedding (its
input width, 3*2*14*14 = 1176, is no multiple of 16) and the norms stay 16-bit."""
from __future__ import annotations

import logging

import torch
from torch import nn

from autoglm_serve.quantization.fp8 import fp8_linear, quantize_rows

logger = logging.getLogger(__name__)


class Fp8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        q, scale = quantize_rows(linear.weight.data)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(q, requires_grad=False)
        self.weight_scale = nn.Parameter(scale.view(-1), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.weight_scale, self.bias)


def quantize_vision_tower(visual: nn.Module, skip: tuple[str, ...] = ("patch_embed",)) -> int:
    """Replaces every eligible nn.Linear of ``visual`` in place; returns how many."""
    targets = [(name, mod) for name, mod in visual.named_modules()
               if isinstance(mod, nn.Linear) and name not in skip
               and mod.in_features % 16 == 0 and mod.out_features % 16 == 0]
    for name, mod in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = visual.get_submodule(parent_name) if parent_name else visual
        setattr(parent, leaf, Fp8Linear(mod))
    logger.info("vision tower: %d linear layers in FP8 W8A8 (--mm-encoder-quantization fp8)",
                len(targets))
    return len(targets)

"""Float32 CPU linears that read their weights as GGUF blocks (kernels/cpu/gguf_block_gemm.py).

The GGUF loader hands the model float32 weights dequantized from Q4_1 and Q8_0 blocks. Where a
layer's weight is exactly such blocks, its blocks are recovered here (the scale and offset that
rebuild every element bit for bit, which GGUF's fp16 scales make unique in practice) and the
dense weight is dropped: the layer then streams 6 (Q4_1) or 9 (Q8_0) bits a weight instead of 32,
and computes the same products. A weight that is not exactly blocks (random, bf16 or other GGUF
types) is left to oneDNN (cpu_onednn_linear.py).
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from autoglm_serve.kernels.cpu.gguf_block_gemm import (GROUP_SIZE, Q4_1, Q8_0, available,
                                                       gguf_block_gemm)
from autoglm_serve.models.layers.linear import LinearBase, UnquantizedLinearMethod

FORMAT_NAMES = {Q4_1: "Q4_1", Q8_0: "Q8_0"}


def _fp16_exact(values: torch.Tensor) -> bool:
    return torch.equal(values.half().float(), values)


def _as_bytes(values: torch.Tensor) -> torch.Tensor:
    """float32 [n, groups, 1] as its bytes [n, groups, 4]."""
    return values.contiguous().view(torch.uint8)


def _groups(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [N, K] as [N, K / 32, 32] groups along K, or None where K is no multiple of 32."""
    n, k = weight.shape
    return None if k % GROUP_SIZE else weight.detach().reshape(n, k // GROUP_SIZE, GROUP_SIZE)


def q4_1_blocks(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [N, K] float32 as Q4_1 blocks, or None where it is not exactly Q4_1: each group
    of 32 along K is m + d * q (q in 0..15; d, m fp16), the GGUF reader's float32 rounding."""
    if (groups := _groups(weight)) is None:
        return None
    low = groups.amin(-1, keepdim=True)   # q = 0 is the group's minimum (llama.cpp's Q4_1)
    span = groups.amax(-1, keepdim=True) - low
    if not _fp16_exact(low):
        return None
    for top in (15, 14, 13):              # the largest q, 15 unless rounding kept it lower
        scale = (span / top).half().float()
        q = torch.where(scale > 0, (groups - low) / scale.clamp_min(1e-30), 0).round_()
        if ((q >= 0) & (q <= 15)).all() and torch.equal(scale * q + low, groups):
            break
    else:
        return None
    q = q.to(torch.uint8)
    nibbles = q[..., :16] | (q[..., 16:] << 4)
    return torch.cat([_as_bytes(scale), _as_bytes(low), nibbles], dim=-1).flatten(1)


def q8_0_blocks(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [N, K] float32 as Q8_0 blocks, or None where it is not exactly Q8_0: each group
    of 32 along K is d * q (q in -127..127; d fp16)."""
    if (groups := _groups(weight)) is None:
        return None
    scale = (groups.abs().amax(-1, keepdim=True) / 127).half().float()
    q = torch.where(scale > 0, groups / scale.clamp_min(1e-30), 0).round_()
    if not (q.abs() <= 127).all() or not torch.equal(scale * q, groups):
        return None
    q = q.to(torch.int8).view(torch.uint8)
    return torch.cat([_as_bytes(scale), q], dim=-1).flatten(1)


def gguf_blocks(weight: torch.Tensor) -> tuple[int, torch.Tensor] | None:
    """(format, blocks) of a float32 CPU weight that is exactly Q4_1 or Q8_0, else None."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return None
    for block_format, recover in ((Q4_1, q4_1_blocks), (Q8_0, q8_0_blocks)):
        blocks = recover(weight)
        if blocks is not None:
            return block_format, blocks
    return None


class GgufBlockLinearMethod(UnquantizedLinearMethod):
    """``layer.weight`` holds the blocks [N, K / 32 * block bytes] uint8."""

    def __init__(self, block_format: int):
        self.block_format = block_format

    def apply(self, layer, x, bias, fp8_rows=None):
        out = gguf_block_gemm(x, layer.weight, self.block_format)
        return out if bias is None else out + bias


def use_gguf_block_linears(model: nn.Module) -> dict[str, int]:
    """Moves every unquantized float32 CPU linear whose weight is exactly GGUF blocks (and the LM
    head's product) to the block kernel; returns how many layers took each format. The LM head
    keeps its dense weight, which a tied embedding reads."""
    from autoglm_serve.models.layers.embedding import ParallelLMHead
    taken = {name: 0 for name in FORMAT_NAMES.values()}
    if not available():
        return taken
    for module in model.modules():
        if isinstance(module, LinearBase) and type(module.linear_method) is UnquantizedLinearMethod:
            if (found := gguf_blocks(module.weight)) is None:
                continue
            module.weight = nn.Parameter(found[1], requires_grad=False)
            module.linear_method = GgufBlockLinearMethod(found[0])
        elif isinstance(module, ParallelLMHead) and module.cpu_logits is None:
            if (found := gguf_blocks(module.weight)) is None:
                continue
            module.cpu_logits = functools.partial(gguf_block_gemm, blocks=found[1],
                                                  block_format=found[0])
        else:
            continue
        taken[FORMAT_NAMES[found[0]]] += 1
    return taken

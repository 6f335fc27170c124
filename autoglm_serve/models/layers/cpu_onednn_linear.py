"""Float32 linears on a CPU through oneDNN, each weight reordered once at load.

`F.linear` on a CPU is MKL's sgemm with the weight as stored, [N, K]; for the few rows of a
decode step that layout is slow on some CPUs (this AMD EPYC without AVX512: SmolLM2's 120
linears at 16 rows 162-192 ms, 2 threads) and each row's result moves with the row count (one
row takes a GEMV, more a GEMM, which sum in another order). oneDNN's inner product over a
weight in its own blocked layout (torch's `mkldnn._reorder_linear_weight`, the one inductor's
CPU freezing uses) took 88-96 ms for the same work, about the same at one row, and gives every
row the same bits at any row count: float32 answers then do not depend on the batch they ran in.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from autoglm_serve.models.layers.linear import LinearBase, UnquantizedLinearMethod


def onednn_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def reorder_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] float32 in oneDNN's blocked layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def onednn_linear(x: torch.Tensor, reordered: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T (+ bias), w given by ``reorder_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, reordered, bias, "none", [], "")


class OneDnnLinearMethod(UnquantizedLinearMethod):
    """``layer.weight`` holds the reordered weight; every row count goes through oneDNN (the
    inherited gated-SiLU GEMV is CUDA-only, so never taken here)."""

    def apply(self, layer, x, bias, fp8_rows=None):
        return onednn_linear(x, layer.weight, bias)


def _float32_on_cpu(weight: torch.Tensor) -> bool:
    return weight.dtype == torch.float32 and weight.device.type == "cpu"


def use_onednn_linears(model: nn.Module) -> int:
    """Moves every unquantized float32 CPU linear (and the LM head) to oneDNN; returns how many
    layers moved. A linear's dense weight is replaced by its reordered form; the LM head keeps
    its dense weight, which a tied embedding reads, and holds the reordered copy beside it."""
    from autoglm_serve.models.layers.embedding import ParallelLMHead
    moved = 0
    for module in model.modules():
        if (isinstance(module, LinearBase)
                and type(module.linear_method) is UnquantizedLinearMethod
                and _float32_on_cpu(module.weight)):
            module.weight = nn.Parameter(reorder_weight(module.weight), requires_grad=False)
            module.linear_method = OneDnnLinearMethod()
            moved += 1
        elif (isinstance(module, ParallelLMHead) and module.cpu_logits is None
              and _float32_on_cpu(module.weight)):
            module.cpu_logits = functools.partial(onednn_linear,
                                                  reordered=reorder_weight(module.weight))
            moved += 1
    return moved

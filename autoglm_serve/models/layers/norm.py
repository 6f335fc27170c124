"""RMSNorm with the residual add folded in (one pass over the activations when fused), and GLM-4's
norm-add-norm pairs in one pass."""
from __future__ import annotations

import torch
from torch import nn

from autoglm_serve.kernels import fused_ops_for


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # float32 statistics, then back to the input dtype before the weight (as transformers);
        # torch's fused rms_norm is bit-equal to x * rsqrt(mean(x^2) + eps) in float32 and one
        # op where that was five (a CPU pays microseconds an op, 61 norms a SmolLM2 step); in
        # float32 on a CPU it takes the weight too, bit-equal to the product after it
        if x.dtype == self.weight.dtype == torch.float32 and x.device.type == "cpu":
            return torch.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        normed = torch.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: norm(x). With it: (norm(x + residual), x + residual)."""
        fused = fused_ops_for(x)
        if fused is not None:
            return fused.rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


def rms_norm_pair(first: RMSNorm, second: RMSNorm, x: torch.Tensor, residual: torch.Tensor,
                  fp8: bool = False):
    """second(first(x), residual): a sublayer output's own norm, the residual add and the next
    norm (GLM-4's sandwich norms), one kernel when fused. Returns (normed sum, sum, fp8_rows):
    where ``fp8`` asks and the kernel is fused, the normed rows quantized per token for the FP8
    layer that takes them (kernels/fp8_rows.Fp8Rows), else None (the layer then quantizes them
    itself)."""
    fused = fused_ops_for(x)
    if fused is not None:
        return fused.rms_norm_pair(x, residual, first.weight, first.eps, second.weight,
                                   second.eps, fp8 and fp8_quantization_on())
    return *second(first(x), residual), None


def fp8_quantization_on() -> bool:
    """Whether the fused FP8 quantization passed its start-up check (kernels/fp8_quant.py):
    the norm's codes are one of its kernels."""
    from autoglm_serve.kernels import fp8_quant
    return fp8_quant.ENABLED

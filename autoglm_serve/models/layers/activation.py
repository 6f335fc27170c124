import torch
import torch.nn.functional as F
from torch import nn

from autoglm_serve.kernels import fused_ops_enabled


class SiluAndMul(nn.Module):
    """silu(gate) * up for a fused [gate | up] projection."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and fused_ops_enabled():
            from autoglm_serve.kernels import fused_ops
            return fused_ops.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

import torch
import torch.nn.functional as F
from torch import nn

from autoglm_serve.kernels import fused_ops_for


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for a fused [gate | up] projection."""
    fused = fused_ops_for(x)
    if fused is not None:
        return fused.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)

"""Rotary position embeddings: full or partial, half-split (Llama) or interleaved (GLM)."""
from __future__ import annotations

import torch
from torch import nn

from autoglm_serve.kernels import fused_ops_for


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` features of every head.

    ``interleaved`` pairs features (0,1), (2,3), ... as GLM does; otherwise the first half is
    paired with the second half as Llama does. cos/sin are precomputed once in float32 with the
    same arithmetic as transformers (position * inv_freq), so results match it exactly.
    """

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, base: float,
                 interleaved: bool):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.interleaved = interleaved
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        freqs = torch.arange(max_position, dtype=torch.float)[:, None] * inv_freq[None, :]
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> cos, sin [T, rotary_dim // 2] (float32)."""
        return self.cos_cache[positions], self.sin_cache[positions]

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return self.apply(q, k, *self.cos_sin(positions))

    def apply(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotates q [T, H*D] and k [T, Hkv*D] with cos/sin computed once per forward."""
        fused = fused_ops_for(q) if self._fusable else None
        if fused is not None:
            return (fused.rotary_(q, cos, sin, self.head_dim, self.interleaved),
                    fused.rotary_(k, cos, sin, self.head_dim, self.interleaved))
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    @property
    def _fusable(self) -> bool:
        half = self.rotary_dim // 2
        return half & (half - 1) == 0

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        x = x.view(t, -1, self.head_dim)
        rot, rest = x[..., :self.rotary_dim], x[..., self.rotary_dim:]
        cos = cos[:, None, :].to(x.dtype)
        sin = sin[:, None, :].to(x.dtype)
        if self.interleaved:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        else:
            x1, x2 = rot.chunk(2, dim=-1)
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return torch.cat((rotated, rest), dim=-1).reshape(t, -1)

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
        self._factor_key: tuple | None = None
        self._factor_values: tuple[torch.Tensor, torch.Tensor] | None = None

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
        factors = self._factors(cos, sin, q.dtype)
        qk = _joint_view(q, k)
        if qk is not None:      # q and k side by side in the qkv projection: one pass for both
            rotated = self._rotate(qk, factors)
            return rotated.split([q.shape[-1], k.shape[-1]], dim=-1)
        return self._rotate(q, factors), self._rotate(k, factors)

    @property
    def _fusable(self) -> bool:
        half = self.rotary_dim // 2
        return half & (half - 1) == 0

    def _factors(self, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
        """x_rotated = x * c + partner(x) * s, with c and s [T, 1, rotary_dim] in x's dtype:
        made once per forward (every layer gets the same cos tensor) instead of per call,
        since on a CPU each small op costs microseconds and a layer made ~20 of them."""
        key = (cos, sin, dtype)
        if self._factor_key is None or any(a is not b for a, b in zip(key, self._factor_key)):
            if self.interleaved:
                c = cos.repeat_interleave(2, dim=-1)
                s = torch.stack((-sin, sin), dim=-1).flatten(-2)
            else:
                c = torch.cat((cos, cos), dim=-1)
                s = torch.cat((-sin, sin), dim=-1)
            self._factor_key = key
            self._factor_values = (c[:, None, :].to(dtype), s[:, None, :].to(dtype))
        return self._factor_values

    def _rotate(self, x: torch.Tensor, factors) -> torch.Tensor:
        # The same products and sums as transformers' q * cos + rotate_half(q) * sin, in x's
        # dtype: x1 * cos - x2 * sin is x1 * cos + x2 * (-sin), bit for bit.
        c, s = factors
        t = x.shape[0]
        x = x.view(t, -1, self.head_dim)
        rot = x[..., :self.rotary_dim] if self.rotary_dim < self.head_dim else x
        if self.interleaved:
            partner = rot.view(t, -1, self.rotary_dim // 2, 2).flip(-1).flatten(-2)
        else:
            x1, x2 = rot.chunk(2, dim=-1)
            partner = torch.cat((x2, x1), dim=-1)
        rotated = rot * c + partner * s
        if rot is not x:
            rotated = torch.cat((rotated, x[..., self.rotary_dim:]), dim=-1)
        return rotated.reshape(t, -1)


def _joint_view(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """[T, (H + Hkv) * D] over q and k where k's columns follow q's in one buffer (the split
    of the fused qkv projection), else None."""
    if (q.dim() != 2 or q.stride() != k.stride() or q.stride(1) != 1
            or k.data_ptr() != q.data_ptr() + q.shape[1] * q.element_size()
            or q.dtype != k.dtype or q.shape[0] != k.shape[0]):
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1]), q.stride())

"""3-D M-RoPE of GLM-4.1V: position ids for one prompt, and the cos/sin tables they index.

Text tokens advance all three rows (temporal, height, width) together. An image's tokens keep one
temporal index and spread over its merged (h, w) grid, all offset by the position where the image
starts; the text after it resumes at ``start + max(h, w)``, so an image costs fewer positions than
tokens. After the prompt every row is equal again, hence one scalar ``delta`` for decoding:
generated token n (n >= len(prompt)) sits at position ``n + delta`` in all three rows.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def _grid_list(image_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None) -> list[tuple[int, int, int]]:
    if image_grid_thw is None:
        return []
    if isinstance(image_grid_thw, torch.Tensor):
        image_grid_thw = image_grid_thw.tolist()
    return [(int(t), int(h), int(w)) for t, h, w in image_grid_thw]


def get_mrope_positions(
    token_ids: Sequence[int] | torch.Tensor,
    image_token_id: int,
    image_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None,
    spatial_merge_size: int = 2,
) -> tuple[torch.Tensor, int]:
    """Positions ``[3, L]`` (int64) and ``delta`` for one prompt whose images are already expanded.

    Each image occupies ``t*h*w / merge**2`` consecutive image tokens, in the order of
    ``image_grid_thw``. Images are consumed by count, so two images with no text between them
    are still told apart (transformers groups runs of image tokens, which is the same thing
    whenever <|begin_of_image|>/<|end_of_image|> separate them, as the chat template does).
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    grids = _grid_list(image_grid_thw)
    length = ids.numel()
    positions = torch.empty(3, length, dtype=torch.long)
    is_image = (ids == image_token_id).tolist()

    grid_idx = 0
    pos = 0     # next free position
    i = 0
    while i < length:
        if not is_image[i]:
            j = i
            while j < length and not is_image[j]:
                j += 1
            positions[:, i:j] = torch.arange(pos, pos + (j - i))
            pos += j - i
            i = j
            continue
        if grid_idx >= len(grids):
            raise ValueError("more image tokens in the prompt than images in image_grid_thw")
        t, h, w = grids[grid_idx]
        grid_idx += 1
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        n = t * gh * gw
        if i + n > length or not all(is_image[i:i + n]):
            raise ValueError(f"image {grid_idx - 1} needs {n} consecutive image tokens")
        tt = torch.arange(t).view(t, 1, 1).expand(t, gh, gw)
        hh = torch.arange(gh).view(1, gh, 1).expand(t, gh, gw)
        ww = torch.arange(gw).view(1, 1, gw).expand(t, gh, gw)
        positions[:, i:i + n] = torch.stack([tt, hh, ww]).reshape(3, n) + pos
        pos += max(gh, gw)
        i += n
    if grid_idx != len(grids):
        raise ValueError(f"{len(grids)} images given but the prompt holds image tokens for {grid_idx}")

    delta = (int(positions.max()) + 1 - length) if length else 0
    return positions, delta


def mrope_inv_freq(head_dim: int, partial_rotary_factor: float = 0.5, rope_theta: float = 10000.0) -> torch.Tensor:
    """Inverse frequencies of the rotated part of each head (float32, ``rotary_dim // 2`` entries)."""
    rotary_dim = int(head_dim * partial_rotary_factor)
    return 1.0 / (rope_theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))


def mrope_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    mrope_section: Sequence[int] = (8, 12, 12),
    partial_rotary_factor: float = 0.5,
    rope_theta: float = 10000.0,
    inv_freq: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[T, rotary_dim]`` (float32) for positions ``[3, T]`` (or ``[T]`` for text only).

    Frequency k takes its angle from row 0, 1 or 2 by which section of ``mrope_section`` it falls
    in; each frequency then covers two adjacent channels (GLM rotates interleaved pairs
    (0,1), (2,3), ... of the first ``rotary_dim`` channels, the rest pass through).
    """
    if inv_freq is None:
        inv_freq = mrope_inv_freq(head_dim, partial_rotary_factor, rope_theta)
    inv_freq = inv_freq.to(device=positions.device, dtype=torch.float)
    if sum(mrope_section) != inv_freq.numel():
        raise ValueError(f"mrope_section {list(mrope_section)} must sum to rotary_dim/2 = {inv_freq.numel()}")
    if positions.dim() == 1:
        positions = positions.unsqueeze(0).expand(3, -1)
    rows = torch.repeat_interleave(
        torch.arange(len(mrope_section), device=positions.device) % 3,
        torch.tensor(list(mrope_section), device=positions.device),
    )
    # pos_per_freq[k, t] = positions[row of k, t]; same float math as the reference (pos.float() * f)
    pos_per_freq = positions.float()[rows]                    # [F, T]
    freqs = pos_per_freq.t() * inv_freq                       # [T, F]
    cos = freqs.cos().repeat_interleave(2, dim=-1)
    sin = freqs.sin().repeat_interleave(2, dim=-1)
    return cos, sin


def apply_mrope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` with interleaved-pair RoPE on its first ``cos.shape[-1]`` channels."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
    rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return torch.cat([x_rot * c + rotated * s, x_pass], dim=-1)

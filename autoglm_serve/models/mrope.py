"""3-D M-RoPE positions of GLM-4.1V for one prompt (models/glm4v.py's MRotaryEmbedding rotates by them).

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


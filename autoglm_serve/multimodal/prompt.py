"""Expanding image placeholders in a tokenized prompt.

The chat template writes one ``<|image|>`` per image (between ``<|begin_of_image|>`` and
``<|end_of_image|>``); the model needs one ``<|image|>`` per merged patch, t*h*w / merge**2 of
them, which the vision tower's output rows then replace one for one. Doing it on ids (not on
text, as transformers' processor does) lets the template be tokenized once, before the images
are even decoded, and needs only each image's grid.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class ExpandedPrompt:
    token_ids: list[int]
    image_ranges: list[tuple[int, int]]     # (start, length) of each image's tokens, in order


def num_image_tokens(grid_thw: Sequence[int], merge_size: int = 2) -> int:
    t, h, w = (int(v) for v in grid_thw)
    return t * h * w // (merge_size * merge_size)


def expand_image_tokens(
    token_ids: Sequence[int],
    image_token_id: int,
    image_grid_thw: torch.Tensor | Sequence[Sequence[int]],
    merge_size: int = 2,
) -> ExpandedPrompt:
    """Replace the k-th ``image_token_id`` with ``num_image_tokens(grid[k])`` copies of it."""
    grids = image_grid_thw.tolist() if isinstance(image_grid_thw, torch.Tensor) else list(image_grid_thw)
    placeholders = sum(1 for t in token_ids if t == image_token_id)
    if placeholders != len(grids):
        raise ValueError(f"prompt has {placeholders} image placeholders but {len(grids)} images were given")
    out: list[int] = []
    ranges: list[tuple[int, int]] = []
    k = 0
    for tok in token_ids:
        if tok == image_token_id:
            n = num_image_tokens(grids[k], merge_size)
            ranges.append((len(out), n))
            out.extend([image_token_id] * n)
            k += 1
        else:
            out.append(int(tok))
    return ExpandedPrompt(token_ids=out, image_ranges=ranges)

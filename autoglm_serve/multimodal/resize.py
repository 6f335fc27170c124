"""Pillow's bicubic resize of 8-bit images, bit for bit, in torch: the engine core resizes on
its own device, in a few dozen elementwise kernels, what PIL resizes in ~44 ms of host time (a
phone screenshot).

Pillow (libImaging/Resample.c, ``Image.resize(size, BICUBIC)`` without box or reducing_gap) is
separable: one pass per axis whose size changes, each rounded and clipped to uint8. Per axis and
output pixel, the filter's support is scaled by the downscale factor, its weights are computed
in double, normalized by their sum and turned into fixed point; the sum of pixel * weight
starts at one half and is shifted back and clipped. The weights are computed here on the host
in float64 with Pillow's operation order (so every double rounds the same way); each pass is
then a gather and an integer multiply-add per tap.
"""
from __future__ import annotations

import functools

import numpy as np
import PIL
import torch

from autoglm_serve.host_transfer import to_device

PRECISION_BITS = 32 - 8 - 2      # Pillow's: 8 bits of result, 2 for overshoot, and a sign bit
SUPPORT = 2.0                    # bicubic's support at scale 1
_PILLOW = tuple(int(part) for part in PIL.__version__.split(".")[:2])


def _vertical_first(in_height: int, in_width: int, height: int, width: int) -> bool:
    """Whether the installed Pillow runs the vertical pass first: 13 does when the height loses
    more than twice as many pixels as the width; 12.2 and 12.3 when the image is over 100 times
    taller than wide and loses height (in Python, as two resizes); earlier versions never."""
    if _PILLOW >= (13, 0):
        return in_height - height > max(0, 2 * (in_width - width))
    if _PILLOW >= (12, 2):
        return in_height > 100 * in_width and height < in_height
    return False


def _bicubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic with a = -0.5, evaluated in Pillow's operation order."""
    x = np.abs(x)
    inner = (1.5 * x - 2.5) * x * x + 1
    outer = (((x - 5) * x + 8) * x - 4) * -0.5
    return np.where(x < 1.0, inner, np.where(x < 2.0, outer, 0.0))


def coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices [taps, out_size] (int64) and fixed-point weights [taps, out_size] (int32)
    of one axis. Taps past a pixel's window have weight 0 (and a valid index)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = SUPPORT * filterscale
    center = (np.arange(out_size) + 0.5) * scale
    # Pillow rounds the window's ends by truncating x + 0.5 toward zero, as astype does
    first = np.maximum((center - support + 0.5).astype(np.int64), 0)
    count = np.minimum((center + support + 0.5).astype(np.int64), in_size) - first
    taps = np.arange(count.max())[:, None]
    index = first + taps                                          # [taps, out]
    weight = np.where(taps < count, _bicubic((index - center + 0.5) * (1.0 / filterscale)), 0.0)
    total = np.zeros(out_size)
    for row in weight:           # in Pillow's order: tap by tap (np.sum promises no order)
        total += row
    weight = np.divide(weight, total, out=weight, where=total != 0.0)
    # Pillow's rounding: +-0.5, then truncation toward zero (its int cast): half away from zero
    fixed = (weight * (1 << PRECISION_BITS) + np.where(weight < 0, -0.5, 0.5)).astype(np.int32)
    # int32 accumulation is safe: |sum| <= 255 * (sum of the positive weights, ~1.1 for
    # bicubic), as in Pillow's own C int accumulators
    assert 255 * int(np.clip(fixed, 0, None).sum(0).max()) + (1 << (PRECISION_BITS - 1)) < 2 ** 31
    return np.minimum(index, in_size - 1), fixed


@functools.lru_cache(maxsize=32)
def _tables(in_size: int, out_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One axis's tables on ``device``, kept: a phone agent sends one screen size all day."""
    index, weight = coefficients(in_size, out_size)
    return to_device(index, torch.int64, device), to_device(weight, torch.int32, device)


def _resample_rows(image: torch.Tensor, out_size: int) -> torch.Tensor:
    """One pass along the rows (dim 0) of an (H, W, C) uint8 image: each tap gathers whole rows."""
    index, weight = _tables(image.shape[0], out_size, image.device)
    weight = weight[:, :, None, None]
    acc = image.index_select(0, index[0]) * weight[0]            # promoted to int32
    for k in range(1, index.shape[0]):
        acc.addcmul_(image.index_select(0, index[k]), weight[k])
    acc.add_(1 << (PRECISION_BITS - 1)).clamp_(0, (256 << PRECISION_BITS) - 1)
    return (acc >> PRECISION_BITS).to(torch.uint8)


def _resample_columns(image: torch.Tensor, out_size: int) -> torch.Tensor:
    """One pass along the columns, as a pass along the rows of the transposed image: gathering
    whole rows instead of single pixels makes it ~2x faster on a CPU, transposes included."""
    return _resample_rows(image.transpose(0, 1).contiguous(), out_size).transpose(0, 1).contiguous()


def resize_bicubic(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(H, W, C) uint8 at ``size`` = (h, w): Pillow's ``resize((w, h), BICUBIC)`` exactly, on
    the image's device. The input itself when the size is unchanged."""
    height, width = size
    in_height, in_width = image.shape[:2]
    # Horizontal first, Pillow runs that pass only over the source rows the vertical pass
    # reads: without a box, those are all rows.
    vertical_first = _vertical_first(in_height, in_width, height, width)
    if vertical_first and in_height != height:
        image = _resample_rows(image, height)
    if in_width != width:
        image = _resample_columns(image, width)
    if not vertical_first and in_height != height:
        image = _resample_rows(image, height)
    return image

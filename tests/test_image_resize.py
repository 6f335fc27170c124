"""The torch bicubic resize against Pillow's: equal pixel for pixel, on the phone screenshot and
on random images of many sizes, on the CPU and (where there is one) the GPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from autoglm_serve.multimodal.image_processor import Glm4vImageProcessor
from autoglm_serve.multimodal.resize import PRECISION_BITS, coefficients, resize_bicubic

SCREENSHOT = Path(__file__).parent / "data/phone_screenshot_1080x2400.png"
CONFIG_DIR = Path(__file__).parents[1] / "autoglm_serve/models/configs/autoglm-phone-9b"
# the max_pixels of the image tests (transformers' default, the checkpoint's, the server's ...)
MAX_PIXELS = (28 * 28 * 15000, 9_633_792, 5_000_000, 1_000_000, 200_000, 100_000, 60_000)


def _pil(array: np.ndarray, height: int, width: int) -> torch.Tensor:
    resized = Image.fromarray(array, "RGB").resize((width, height), Image.Resampling.BICUBIC)
    return torch.from_numpy(np.array(resized))


def _noise(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _assert_same_as_pil(array: np.ndarray, height: int, width: int, device: str = "cpu"):
    got = resize_bicubic(torch.from_numpy(array).to(device), (height, width))
    assert got.dtype == torch.uint8 and got.device.type == device
    assert got.shape == (height, width, 3)
    assert torch.equal(got.cpu(), _pil(array, height, width)), (array.shape, (height, width))


@pytest.fixture(scope="module")
def screenshot() -> np.ndarray:
    return np.array(Image.open(SCREENSHOT).convert("RGB"))


@pytest.mark.parametrize("max_pixels", MAX_PIXELS)
def test_screenshot_at_the_tests_max_pixels(screenshot, max_pixels):
    processor = Glm4vImageProcessor.from_pretrained(CONFIG_DIR, max_pixels=max_pixels)
    _assert_same_as_pil(screenshot, *processor.target_size(*screenshot.shape[:2]))


@pytest.mark.parametrize("size", [
    (2352, 1036), (3080, 1372), (4800, 2160),       # the screenshot: slightly down, up, 2x up
    (2400, 1036), (2352, 1080),                     # one axis only
    (1, 1), (1, 1080), (2400, 1), (3, 5),           # down to almost nothing
    (1200, 540), (600, 270), (240, 108),            # exact divisors
])
def test_screenshot_sizes(screenshot, size):
    _assert_same_as_pil(screenshot, *size)


def _random_sizes(n: int, seed: int, limit: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    return [tuple(int(v) for v in rng.integers(1, limit, 4)) for _ in range(n)]


@pytest.mark.parametrize("in_h,in_w,out_h,out_w", _random_sizes(150, seed=1, limit=160)
                         + _random_sizes(20, seed=2, limit=700))
def test_random_sizes(in_h, in_w, out_h, out_w):
    _assert_same_as_pil(_noise(in_h, in_w, seed=in_h * out_w), out_h, out_w)


@pytest.mark.parametrize("in_h,in_w,out_h,out_w", [
    (1, 1, 1, 1), (1, 1, 7, 3), (2, 2, 1, 1), (2, 3, 5, 1), (5, 4, 3, 2), (13, 57, 28, 112),
    (1, 300, 1, 150), (1, 300, 2, 600), (300, 1, 28, 1), (400, 2, 200, 56),   # extreme aspect
    (1, 200, 4, 28), (200, 3, 28, 1),
    (64, 64, 64, 32), (64, 64, 32, 64), (64, 64, 64, 97), (64, 64, 97, 64),   # one axis only
    (31, 17, 31, 17),                                                        # identity
    (333, 777, 111, 259), (1001, 99, 28, 28), (99, 1001, 7, 500),            # strong reduction
])
def test_tiny_odd_and_extreme_sizes(in_h, in_w, out_h, out_w):
    _assert_same_as_pil(_noise(in_h, in_w, seed=in_w * 31 + in_h), out_h, out_w)


@pytest.mark.parametrize("in_w,out_w", [(20, 10), (20, 11), (60, 30), (60, 31), (60, 29)])
def test_pass_order_either_side_of_pillows_rule(in_w, out_w):
    """Pillow 13 resizes vertically first when the height loses more than twice as many pixels
    as the width (earlier versions only for images over 100 times taller than wide, or never);
    on noise the two orders differ."""
    in_h = 100
    for shrink in (2 * (in_w - out_w) - 1, 2 * (in_w - out_w), 2 * (in_w - out_w) + 1):
        _assert_same_as_pil(_noise(in_h, in_w, seed=shrink), in_h - shrink, out_w)


def test_unchanged_size_is_the_input_itself():
    pixels = torch.from_numpy(_noise(9, 7, seed=0))
    assert resize_bicubic(pixels, (9, 7)) is pixels


def _pillow_coefficients(in_size: int, out_size: int) -> list[tuple[int, list[int]]]:
    """Resample.c's precompute_coeffs and normalize_coeffs_8bpc, transcribed loop for loop:
    each output pixel's first source pixel and fixed-point weights."""
    def bicubic(x: float) -> float:
        x = abs(x)
        if x < 1.0:
            return (1.5 * x - 2.5) * x * x + 1
        if x < 2.0:
            return (((x - 5) * x + 8) * x - 4) * -0.5
        return 0.0

    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    rows = []
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        weights = [bicubic((x + xmin - center + 0.5) * (1.0 / filterscale)) for x in range(xmax)]
        total = 0.0
        for w in weights:
            total += w
        weights = [w / total for w in weights] if total != 0.0 else weights
        one = 1 << PRECISION_BITS
        rows.append((xmin, [int(-0.5 + w * one) if w < 0 else int(0.5 + w * one) for w in weights]))
    return rows


@pytest.mark.parametrize("in_size,out_size", [(1080, 1036), (2400, 2352), (1080, 1372), (2400, 252),
                                              (1, 5), (5, 1), (7, 3), (3, 7), (997, 28), (28, 997)])
def test_coefficients_are_pillows(in_size, out_size):
    index, weight = coefficients(in_size, out_size)
    assert index.dtype == np.int64 and weight.dtype == np.int32
    for xx, (first, fixed) in enumerate(_pillow_coefficients(in_size, out_size)):
        taps = len(fixed)
        assert index[:taps, xx].tolist() == list(range(first, first + taps))
        assert weight[:taps, xx].tolist() == fixed
        assert not weight[taps:, xx].any()
        assert 0 <= index[:, xx].min() and index[:, xx].max() < in_size
    assert weight[-1].any()          # no tap that no pixel uses


@pytest.mark.gpu
@pytest.mark.parametrize("size", [(2352, 1036), (252, 112), (3080, 1372)])
def test_cuda_equals_pillow(screenshot, size):
    _assert_same_as_pil(screenshot, *size, device="cuda")

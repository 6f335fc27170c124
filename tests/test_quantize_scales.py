"""Scale search of round-to-nearest FP8 weights: never worse than amax / 448, never clipping, and
on weights that sit on a coarse 4-bit grid (as a Q4_1 GGUF's do) clearly better."""
import pytest
import torch

pytest.importorskip("compressed_tensors")

from autoglm_serve.quantize.rtn import rtn_quantize  # noqa: E402
from autoglm_serve.quantize.schemes import weight_args  # noqa: E402


def test_fp8_scale_search_lowers_error_on_a_4bit_grid():
    g = torch.Generator().manual_seed(0)
    rows, groups = 64, 8
    # Q4_1-like: per group of 32, min + k * step with k in 0..15
    step = torch.rand(rows, groups, 1, generator=g) * 0.01 + 0.002
    low = -step * (torch.rand(rows, groups, 1, generator=g) * 4 + 6)
    w = (low + torch.randint(0, 16, (rows, groups, 32), generator=g) * step).reshape(rows, -1)
    args = weight_args("fp8")
    plain = rtn_quantize(w, args, torch.float32, clip_search=False)
    searched = rtn_quantize(w, args, torch.float32)
    torch.testing.assert_close(plain.scale, w.abs().amax(1, keepdim=True) / 448)
    assert (searched.scale >= plain.scale).all()                  # the largest weight still fits
    row_err = lambda q: (q.weight - w).pow(2).sum(1)  # noqa: E731
    assert (row_err(searched) <= row_err(plain)).all()
    assert row_err(searched).sum() < 0.7 * row_err(plain).sum()

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


def test_asymmetric_int4_search_lowers_error_and_matches_the_stored_grid():
    """Zero-point int4 on a Q4_1-like grid: the searched (scale, zero point) never does worse per
    group than min/max, clearly better in sum, and is exactly what compressed-tensors stores."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    g = torch.Generator().manual_seed(1)
    rows, groups = 64, 8
    step = torch.rand(rows, groups, 1, generator=g) * 0.01 + 0.002
    low = -step * (torch.rand(rows, groups, 1, generator=g) * 8 + 4)
    w = (low + torch.randint(0, 16, (rows, groups, 32), generator=g) * step).reshape(rows, -1)
    args = weight_args("rtn", group_size=32, symmetric=False)
    plain = rtn_quantize(w, args, torch.float32, clip_search=False)
    searched = rtn_quantize(w, args, torch.float32)
    assert searched.zero_point.dtype == torch.int8
    group_err = lambda q: (q.weight - w).pow(2).reshape(rows, groups, 32).sum(-1)  # noqa: E731
    assert (group_err(searched) <= group_err(plain) * (1 + 1e-5)).all()
    assert group_err(searched).sum() < 0.8 * group_err(plain).sum()
    # the weight the loader rebuilds from the stored scale and integer zero point
    torch.testing.assert_close(fake_quantize(w, searched.scale, searched.zero_point, args),
                               searched.weight)


def test_the_search_takes_a_models_parameter():
    # rtn and awq hand it nn.Linear.weight, which requires grad; the search writes into buffers
    g = torch.Generator().manual_seed(2)
    w = torch.randn(48, 64, generator=g)
    args = weight_args("rtn", group_size=32, symmetric=False)
    from_tensor = rtn_quantize(w, args, torch.float32)
    from_parameter = rtn_quantize(torch.nn.Parameter(w.clone()), args, torch.float32)
    assert torch.equal(from_parameter.scale, from_tensor.scale)
    assert torch.equal(from_parameter.zero_point, from_tensor.zero_point)


def test_the_fp8_search_equals_compressed_tensors_fake_quantize():
    """The search's buffered candidates against the library's fake_quantize, candidate by
    candidate: the same scales come out, and the same weight."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    from autoglm_serve.quantize import rtn
    g = torch.Generator().manual_seed(3)
    step = torch.rand(96, 4, 1, generator=g) * 0.01 + 0.002
    w = torch.cat([(torch.randint(0, 16, (96, 4, 32), generator=g) * step - 7 * step).reshape(96, -1),
                   torch.randn(96, 64, generator=g) * 0.05, torch.zeros(96, 8)], dim=1)
    w[5] = 0.0                                         # an all-zero row
    args = weight_args("fp8")
    plain = rtn_quantize(w, args, torch.float32, clip_search=False)

    def library_candidates():
        for stretch in rtn._FP8_STRETCHES:
            s = plain.scale * stretch
            yield (s,), (fake_quantize(w, s, plain.zero_point, args) - w).pow(2).sum(1, keepdim=True)
    expected = rtn._least_error(library_candidates())[0]
    searched = rtn_quantize(torch.nn.Parameter(w.clone()), args, torch.float32)
    assert torch.equal(searched.scale, expected)
    assert torch.equal(searched.weight, fake_quantize(w, expected, plain.zero_point, args))

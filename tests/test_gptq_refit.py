"""GPTQ's group scales solved again for the codes it chose (gptq.refit_group_scales): the least
squares optimum of the layer's output error, lower output error than GPTQ's own scales on the
calibration inputs and on other inputs of the same kind, and still exactly what a loader
rebuilds from the stored scale and integer zero point."""
import pytest
import torch

pytest.importorskip("compressed_tensors")

from autoglm_serve.quantize.gptq import gptq_quantize, refit_group_scales  # noqa: E402
from autoglm_serve.quantize.schemes import weight_args  # noqa: E402

ROWS, COLS, GROUP = 48, 128, 32


def _inputs(generator: torch.Generator, tokens: int) -> torch.Tensor:
    """Correlated inputs with a few loud channels, as a decoder layer's are."""
    mixing = torch.randn(COLS, COLS, generator=torch.Generator().manual_seed(7)) / COLS ** 0.5
    loudness = torch.ones(COLS)
    loudness[:3] = 20.0
    return (torch.randn(tokens, COLS, generator=generator) @ (torch.eye(COLS) + mixing)) * loudness


def _weight(generator: torch.Generator) -> torch.Tensor:
    """On a Q4_1-like grid (a 4-bit GGUF's, as the embedded model's are): min + k * step."""
    groups = COLS // GROUP
    step = torch.rand(ROWS, groups, 1, generator=generator) * 0.01 + 0.002
    low = -step * (torch.rand(ROWS, groups, 1, generator=generator) * 8 + 4)
    codes = torch.randint(0, 16, (ROWS, groups, GROUP), generator=generator)
    return (low + codes * step).reshape(ROWS, COLS)


def _output_error(w: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> float:
    return (x @ (w - q).t()).pow(2).sum().item()


@pytest.mark.parametrize("symmetric,act_order", [(False, True), (True, True), (True, False)])
def test_refit_lowers_output_error_and_keeps_the_stored_grid(symmetric, act_order):
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    g = torch.Generator().manual_seed(0)
    w, calibration, held_out = _weight(g), _inputs(g, 512), _inputs(g, 2048)
    args = weight_args("gptq", group_size=GROUP, act_order=act_order, symmetric=symmetric)
    hessian = calibration.t() @ calibration
    plain = gptq_quantize(w, hessian, len(calibration), args, torch.float32, act_order=act_order,
                          refit=False)
    refit = gptq_quantize(w, hessian, len(calibration), args, torch.float32, act_order=act_order)
    assert torch.equal(refit.zero_point, plain.zero_point)
    assert not torch.equal(refit.scale, plain.scale)
    for x in (calibration, held_out):
        assert _output_error(w, refit.weight, x) < 0.97 * _output_error(w, plain.weight, x)
    # the same integer codes, and on the stored grid: what the checkpoint's writer packs and a
    # loader rebuilds from the stored scale and zero point
    codes = lambda q: torch.round(q.weight / q.scale.repeat_interleave(GROUP, 1))  # noqa: E731
    assert torch.equal(codes(refit), codes(plain))
    torch.testing.assert_close(fake_quantize(refit.weight, refit.scale, refit.zero_point, args),
                               refit.weight, rtol=0, atol=0)


def test_refit_is_the_least_squares_optimum():
    """Against a dense solve of one row at a time in float64: min over s of
    (w - A s)^T H (w - A s), A [cols, groups] holding the codes of each group in its column."""
    g = torch.Generator().manual_seed(1)
    w, x = _weight(g), _inputs(g, 512)
    hessian = x.t() @ x
    args = weight_args("gptq", group_size=GROUP, act_order=True, symmetric=False)
    plain = gptq_quantize(w, hessian, len(x), args, torch.float32, act_order=True, refit=False)
    refit_weight, refit_scale = refit_group_scales(w, plain.weight, plain.scale, hessian, args,
                                                   rows_per_solve=5)   # chunks of rows: uneven
    codes = torch.round(plain.weight / plain.scale.repeat_interleave(GROUP, 1)).double()
    root = torch.linalg.cholesky(hessian.double()).t()     # H = root^T root
    for row in range(ROWS):
        a = torch.zeros(COLS, COLS // GROUP, dtype=torch.float64)
        for group in range(COLS // GROUP):
            cols = slice(group * GROUP, (group + 1) * GROUP)
            a[cols, group] = codes[row, cols]
        best = torch.linalg.lstsq(root @ a, root @ w[row].double()).solution
        torch.testing.assert_close(refit_scale[row].double(), best, rtol=2e-4, atol=1e-7)
    torch.testing.assert_close(refit_weight,
                               codes.float() * refit_scale.repeat_interleave(GROUP, 1))

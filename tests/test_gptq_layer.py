"""GPTQ on one small Linear: on the calibration inputs its output error beats round-to-nearest's,
and with uncorrelated inputs (a diagonal Hessian: nothing to compensate) its column pass (without
the scales' refit, tests/test_gptq_refit.py) is exactly RTN, which checks the group scales, zero
points and the act-order permutation and its inverse."""
import pytest
import torch

pytest.importorskip("compressed_tensors")

from compressed_tensors.quantization import QuantizationArgs  # noqa: E402

from autoglm_serve.quantize.gptq import HessianObserver, gptq_quantize  # noqa: E402
from autoglm_serve.quantize.rtn import rtn_quantize  # noqa: E402

IN, OUT, GROUP = 320, 48, 32   # 320: three blocks of 128 columns, the last one partial


def _args(symmetric: bool) -> QuantizationArgs:
    return QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=GROUP,
                            symmetric=symmetric, dynamic=False)


def _calibration_inputs(seed: int = 0) -> torch.Tensor:
    """Correlated inputs with a few loud channels, as a decoder layer's are."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(IN, IN, generator=g) / IN ** 0.5 + torch.eye(IN)
    x = torch.randn(512, IN, generator=g) @ mix
    x[:, torch.randperm(IN, generator=g)[:6]] *= 8.0
    return x


def _observed_hessian(linear: torch.nn.Linear, x: torch.Tensor) -> HessianObserver:
    observer = HessianObserver(linear)
    with torch.no_grad():
        for chunk in x.split(100):   # several calls, as the calibration samples come
            linear(chunk)
    observer.remove()
    return observer


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_output_error_below_rtn(symmetric, act_order):
    torch.manual_seed(0)
    linear = torch.nn.Linear(IN, OUT, bias=False)
    x = _calibration_inputs()
    obs = _observed_hessian(linear, x)
    assert obs.tokens == x.shape[0]
    w = linear.weight.detach()
    gptq = gptq_quantize(w, obs.hessian, obs.tokens, _args(symmetric), torch.float32, act_order)
    rtn = rtn_quantize(w, _args(symmetric), torch.float32)
    error = lambda q: (x @ (w - q.weight).t()).norm().item()  # noqa: E731
    assert error(gptq) < 0.8 * error(rtn), (error(gptq), error(rtn))
    if not symmetric:
        assert gptq.zero_point.abs().sum() > 0   # zero points are used, not left at 0
    # what is returned is on the grid its own scales and zero points describe
    from autoglm_serve.quantize.rtn import quantize_dequantize
    assert torch.equal(quantize_dequantize(gptq.weight, gptq.scale, gptq.zero_point, _args(symmetric)),
                       gptq.weight)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("clip_search", [False, True])
def test_gptq_with_uncorrelated_inputs_is_rtn(symmetric, act_order, clip_search):
    torch.manual_seed(1)
    w = torch.randn(OUT, IN)
    diag = torch.rand(IN) * 10 + 0.1      # distinct activity per input: act-order reorders
    hessian = torch.diag(diag)
    gptq = gptq_quantize(w, hessian, 1, _args(symmetric), torch.float32, act_order, damp=0.0,
                         clip_search=clip_search, refit=False)
    rtn = rtn_quantize(w, _args(symmetric), torch.float32, clip_search=clip_search)
    torch.testing.assert_close(gptq.weight, rtn.weight, rtol=0, atol=1e-6)
    torch.testing.assert_close(gptq.scale, rtn.scale)
    assert torch.equal(gptq.zero_point.to(torch.int32), rtn.zero_point.to(torch.int32))

"""Coordinate descent on GPTQ's codes (gptq.descend_codes): it never raises its objective, it
stops where no single code step lowers it, it keeps the stored grid (scales, zero points, codes
in range), and with uncorrelated inputs it is rounding to nearest on the given scales."""
import pytest
import torch

pytest.importorskip("compressed_tensors")

from compressed_tensors.quantization.utils.helpers import calculate_range  # noqa: E402

from autoglm_serve.quantize.gptq import descend_codes, gptq_quantize  # noqa: E402
from autoglm_serve.quantize.schemes import weight_args  # noqa: E402

ROWS, COLS, GROUP = 24, 96, 32


def _problem(seed: int, symmetric: bool):
    """Q4_1-like weights (as the embedded model's), correlated inputs with loud channels, and
    GPTQ's codes for them before any descent or refit."""
    g = torch.Generator().manual_seed(seed)
    groups = COLS // GROUP
    step = torch.rand(ROWS, groups, 1, generator=g) * 0.01 + 0.002
    low = -step * (torch.rand(ROWS, groups, 1, generator=g) * 8 + 4)
    w = (low + torch.randint(0, 16, (ROWS, groups, GROUP), generator=g) * step).reshape(ROWS, COLS)
    mixing = torch.randn(COLS, COLS, generator=g) / COLS ** 0.5
    loudness = torch.ones(COLS)
    loudness[:3] = 20.0
    x = (torch.randn(400, COLS, generator=g) @ (torch.eye(COLS) + mixing)) * loudness
    hessian = x.t() @ x
    args = weight_args("gptq", group_size=GROUP, act_order=True, symmetric=symmetric)
    q = gptq_quantize(w, hessian, len(x), args, torch.float32, act_order=True, refit=False,
                      descent_passes=0)
    return w, hessian, args, q


def _objective(w, q, hessian) -> float:
    r = (w - q).double()
    return torch.einsum("ij,jk,ik->", r, hessian.double(), r).item()


def _codes(q, scale, zero):
    return torch.round(q / scale.repeat_interleave(GROUP, 1)) + zero.repeat_interleave(GROUP, 1)


@pytest.mark.parametrize("symmetric", [False, True])
def test_descent_lowers_its_objective_to_a_local_minimum_on_the_stored_grid(symmetric):
    w, hessian, args, gptq = _problem(0, symmetric)
    objective = hessian + 5.0 * torch.diag(hessian.diagonal())
    order = torch.argsort(hessian.diagonal(), descending=True)
    values = [_objective(w, gptq.weight, objective)]
    q = gptq.weight
    for _ in range(12):
        q = descend_codes(w, q, gptq.scale, gptq.zero_point, objective, args, 1, order,
                          block_size=40)      # blocks that split the groups: uneven on purpose
        values.append(_objective(w, q, objective))
    assert all(b <= a * (1 + 1e-6) for a, b in zip(values, values[1:])), values
    assert values[-1] < 0.98 * values[0]
    # no single code one step up or down (inside the range) lowers the objective any more:
    # moving weight (r, j) by d changes it by -2 d (R H)_rj + d^2 H_jj
    qmin, qmax = (float(v) for v in calculate_range(args, w.device))
    codes = _codes(q, gptq.scale, gptq.zero_point)
    step = gptq.scale.repeat_interleave(GROUP, 1)
    slope = ((w - q).double() @ objective.double())
    for sign in (1.0, -1.0):
        d = (sign * step).double()
        change = -2 * d * slope + d * d * objective.diagonal().double()
        allowed = (codes + sign >= qmin) & (codes + sign <= qmax)
        assert (change[allowed] >= -1e-9 * values[-1]).all()
    # the stored grid: integer codes in range that rebuild q from the untouched scale and zero
    assert torch.equal(codes, torch.round(codes)) and codes.min() >= qmin and codes.max() <= qmax
    torch.testing.assert_close(q, (codes - gptq.zero_point.repeat_interleave(GROUP, 1)) * step,
                               rtol=0, atol=0)


def test_descent_with_uncorrelated_inputs_rounds_to_nearest():
    """A diagonal H separates the weights: each one's best code is its nearest."""
    w, hessian, args, gptq = _problem(1, symmetric=False)
    diagonal = torch.diag(hessian.diagonal())
    q = descend_codes(w, gptq.weight, gptq.scale, gptq.zero_point, diagonal, args, 1,
                      torch.arange(COLS))
    qmin, qmax = (float(v) for v in calculate_range(args, w.device))
    step = gptq.scale.repeat_interleave(GROUP, 1)
    zero = gptq.zero_point.repeat_interleave(GROUP, 1)
    nearest = (torch.clamp(torch.round(w / step) + zero, qmin, qmax) - zero) * step
    assert not torch.equal(gptq.weight, nearest)     # GPTQ's compensation moved some codes
    torch.testing.assert_close(q, nearest, rtol=0, atol=0)

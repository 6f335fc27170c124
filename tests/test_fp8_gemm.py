"""The split-K FP8 GEMM (kernels/fp8_gemm.py) against the W8A8 dequantize-then-matmul reference:
on CPU in the Triton interpreter at small shapes spanning partial tiles of M and N, partial K
chunks, bias and split-K; on CUDA the compiled kernel at AutoGLM's shapes, and the layers'
dispatch to it."""
import pytest
import torch

pytest.importorskip("triton")
from autoglm_serve.kernels import fp8_gemm, gemv  # noqa: E402
from autoglm_serve.kernels.fp8_gemm import GemmConfig  # noqa: E402
from autoglm_serve.quantization import fp8, kernel_checks  # noqa: E402
from autoglm_serve.quantization.fp8 import quantize_rows  # noqa: E402
from autoglm_serve.quantization.kernel_checks import fp8_reference, random_fp8  # noqa: E402
from triton_kernel_tests import DEVICE, rel, require_gpu_or_interpreter  # noqa: E402

require_gpu_or_interpreter()
pytestmark = pytest.mark.usefixtures("triton_interpreter_fixes")

# K = 200: BLOCK_K 64 and 128 leave a partial last chunk; N = 37 a partial tile of N; 3 rows
# fill part of one 16-row tile (the 1-8 rows the FP8 GEMV may leave to this kernel), 1 row the
# least of it
CONFIGS = [GemmConfig(16, 32, 64), GemmConfig(32, 16, 128, split_k=2),
           GemmConfig(16, 32, 64, split_k=3)]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [1, 3, 9, 40])
def test_fp8_gemm_keeps_w8a8_numerics(bias, m):
    """The e4m3 products of the W8A8 reference, summed in fp32: only the order differs."""
    g = torch.Generator().manual_seed(0)
    w, ws = random_fp8(37, 200, DEVICE, g)
    x = (torch.randn(m, 200, generator=g) * torch.logspace(-2, 1, m)[:, None]).to(DEVICE,
                                                                                torch.bfloat16)
    b = torch.randn(37, generator=g).to(DEVICE, torch.bfloat16) if bias else None
    xq, xs = quantize_rows(x)
    want = fp8_reference(x, w, ws, b)
    for cfg in CONFIGS:
        out = fp8_gemm.fp8_gemm(xq, xs, w, ws, b, torch.bfloat16, cfg)
        assert out.shape == (m, 37) and out.dtype == torch.bfloat16
        assert rel(out, want) < 5e-3, cfg


def test_split_k_counters_are_ready_for_the_next_launch():
    """The last program of a tile resets its counter: a second launch on the same workspace
    (as a CUDA-graph replay is) reduces again, with other inputs."""
    g = torch.Generator().manual_seed(1)
    w, ws = random_fp8(37, 200, DEVICE, g)
    cfg = GemmConfig(16, 32, 64, split_k=3)
    for _ in range(2):
        x = torch.randn(20, 200, generator=g).to(DEVICE, torch.bfloat16)
        out = fp8_gemm.fp8_gemm(*quantize_rows(x), w, ws, None, torch.bfloat16, cfg)
        assert rel(out, fp8_reference(x, w, ws)) < 5e-3
    # the workspace of N = 37, split 3, 32 rows (20 rows' bucket): 2 x 2 tiles
    counts = [c for (_, n, tiles, split, _, rows), (_, c) in gemv._workspaces.items()
              if (n, tiles, split, rows) == (37, 4, 3, 32)]
    assert len(counts) == 1 and not counts[0].any()


def test_untuned_shapes_stay_on_scaled_mm(monkeypatch):
    monkeypatch.setattr(fp8_gemm, "TUNED", {(32, 4608, 4096): GemmConfig(32, 128, 128, 4)})
    assert fp8_gemm.select_config(20, 4608, 4096) == GemmConfig(32, 128, 128, 4)
    assert fp8_gemm.select_config(20, 4096, 4096) is None       # another shape
    assert fp8_gemm.select_config(40, 4608, 4096) is None       # another rows bucket
    assert fp8_gemm.select_config(1, 4608, 4096) is None        # the 16-row bucket
    # fewer rows than the smallest tile run the 16-row tiles (where the FP8 GEMV's TUNED leaves
    # them to this GEMM: kernels/fp8_gemv.py decides that)
    monkeypatch.setattr(fp8_gemm, "TUNED", {(16, 4608, 4096): GemmConfig(16, 64, 128, 4)})
    assert fp8_gemm.select_config(1, 4608, 4096) == GemmConfig(16, 64, 128, 4)
    assert fp8_gemm.select_config(2, 4608, 4096) == GemmConfig(16, 64, 128, 4)
    assert fp8_gemm.select_config(513, 4608, 4096) is None      # past MAX_ROWS


def test_a_declined_gated_gemv_leaves_gate_up_to_the_gemm():
    """Where the FP8 gated GEMV is declined (None), the MLP runs gate_up as a plain linear: that
    shape must be declined too, or the GEMV's untuned default tiles take it instead of the
    split-K GEMM the gated entry was measured against (an H100's 8-row decode step ran gate_up
    through the GEMV at 57.5 us before this)."""
    from autoglm_serve.kernels import fp8_gemv
    declined = [(rows, n, k) for (kind, rows, n, k), cfg in fp8_gemv.TUNED.items()
                if kind == "gated" and cfg is None]
    assert declined
    for rows, n, k in declined:
        assert fp8_gemv.TUNED.get(("linear", rows, 2 * n, k), "missing") is None, (rows, n, k)
        assert fp8_gemm.select_config(rows, 2 * n, k) is not None, (rows, n, k)


def test_start_up_check_covers_the_tuned_configs(monkeypatch):
    """Each tuned config runs at its own rows and K; a wrong result switches the kernel off."""
    monkeypatch.setattr(fp8_gemm, "TUNED", {(16, 4096, 320): GemmConfig(16, 32, 64, 2),
                                            (32, 4096, 320): None})
    names = [case[0] for case in kernel_checks.fp8_gemm_cases(torch.device(DEVICE),
                                                               torch.bfloat16)]
    assert "tuned 16x4096x320" in names and "tuned 32x4096x320" not in names
    try:
        assert kernel_checks.check_fp8_gemm(torch.device(DEVICE), torch.bfloat16)
        real = fp8_gemm.fp8_gemm
        monkeypatch.setattr(fp8_gemm, "fp8_gemm", lambda xq, *a, **kw: real(xq, *a, **kw) * 1.1)
        assert not kernel_checks.check_fp8_gemm(torch.device(DEVICE), torch.bfloat16)
        assert not fp8_gemm.ENABLED
    finally:
        fp8_gemm.ENABLED = True


SHAPES = {"qkv": (4608, 4096), "o_proj": (4096, 4096), "gate_up": (27392, 4096),
          "down": (4096, 13696)}


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 16, 48, 256, 500])
def test_compiled_fp8_gemm_at_the_model_shapes(m):
    """The compiled kernel (Hopper's e4m3 tensor cores) on AutoGLM's four linear shapes, with
    and without split-K; the same inputs give the same bits twice (the split-K sum order is
    fixed)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in SHAPES.items():
        w, ws = random_fp8(n, k, "cuda", g)
        x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        bias = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16)
        xq, xs = quantize_rows(x)
        want = fp8_reference(x, w, ws, bias)
        for cfg in (GemmConfig(64, 128, 128, 1, 4, 4), GemmConfig(16, 128, 256, 4, 4, 3),
                    GemmConfig(128, 64, 128, 8, 8, 3)):
            out = fp8_gemm.fp8_gemm(xq, xs, w, ws, bias, torch.bfloat16, cfg)
            assert rel(out, want) < 1e-2, (name, m, cfg)
            again = fp8_gemm.fp8_gemm(xq, xs, w, ws, bias, torch.bfloat16, cfg)
            assert torch.equal(out, again), (name, m, cfg)


@pytest.mark.gpu
def test_fp8_linear_takes_the_split_k_gemm_for_a_tuned_shape(monkeypatch):
    monkeypatch.setattr(fp8_gemm, "TUNED", {(32, 4608, 4096): GemmConfig(32, 128, 128, 4)})
    calls = []
    real = fp8_gemm.fp8_gemm
    monkeypatch.setattr(fp8_gemm, "fp8_gemm", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    g = torch.Generator(device="cuda").manual_seed(0)
    w, ws = random_fp8(4608, 4096, "cuda", g)
    bias = torch.randn(4608, generator=g, device="cuda").to(torch.bfloat16)
    for m, taken in ((20, True), (40, False), (4, False)):
        x = torch.randn(m, 4096, generator=g, device="cuda").to(torch.bfloat16)
        calls.clear()
        assert rel(fp8.fp8_linear(x, w, ws, bias), fp8_reference(x, w, ws, bias)) < 1e-2
        assert bool(calls) == taken, m

"""The 8-bit decode GEMV (kernels/w8a16_gemv.py) against dequantize-then-matmul: on CPU in the
Triton interpreter at small shapes spanning partial tiles, partial K chunks, groups within and
across a tile, zeros or not, bias, gating, split-K, CUDA cores and tensor cores, 16-bit
activations read as pairs; its start-up check; the linear method's dispatch; on CUDA the
compiled kernel at AutoGLM's shapes."""
import pytest
import torch

pytest.importorskip("triton")
from autoglm_serve.kernels import w4a16_gemv, w8a16_gemv  # noqa: E402
from autoglm_serve.kernels.gemv import GemvConfig as Config  # noqa: E402
from autoglm_serve.quantization import kernel_checks, wna16  # noqa: E402
from autoglm_serve.quantization.kernel_checks import random_wn, wna16_reference  # noqa: E402
from triton_kernel_tests import DEVICE, rel, require_gpu_or_interpreter  # noqa: E402

require_gpu_or_interpreter()
pytestmark = pytest.mark.usefixtures("triton_interpreter_fixes")


def gen():
    return torch.Generator().manual_seed(0)


# K = 320: BLOCK_K 64 / 128 / 256 leave a partial last chunk; N = 37 a partial tile. Group 32
# against BLOCK_K 128 puts several groups in a tile, group 128 against BLOCK_K 64 several tiles
# in a group.
CONFIGS = {1: [Config(16, 64, 1), Config(8, 256, 2, dot=False)],
           3: [Config(16, 128, 3, dot=True), Config(8, 64, 2, dot=False)],
           16: [Config(16, 128, 2, dot=True), Config(32, 64, 1, dot=True)]}


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_w8a16_gemv_matches_dequantized_matmul(group, zeros, m):
    """fp32 activations: the dequantized weights are exact, so only the summation order differs
    from the reference (the CUDA-core path's sums of 256 + q against 256 x give up ~9 bits of
    fp32's 24)."""
    k = 320 if group != 128 else 384
    g = gen()
    qw, s, z = random_wn(37, k, 8, group, zeros, torch.bfloat16, DEVICE, g)
    x = torch.randn(m, k, generator=g).to(DEVICE)
    bias = torch.randn(37, generator=g).to(DEVICE)
    for cfg in CONFIGS[m]:
        out = w8a16_gemv.w8a16_gemv(x, qw, s, z, group, bias if zeros else None, cfg)
        assert out.shape == (m, 37) and out.dtype == torch.float32
        assert rel(out, wna16_reference(x, qw, s, z, 8, group, bias if zeros else None)) < 1e-5


@pytest.mark.parametrize("m", [17, 33, w8a16_gemv.WIDE_MAX_ROWS])
def test_w8a16_gemv_past_sixteen_rows(m):
    """Decode batches of 17..WIDE_MAX_ROWS rows on tensor cores, with split-K (its partials'
    workspace holds the rows bucket, 32 or 64; one of 16 rows would be overrun), bias and
    gating; dispatched only where TUNED has the shape."""
    g = gen()
    qw, s, z = random_wn(37, 384, 8, 128, True, torch.bfloat16, DEVICE, g)
    gate_up = random_wn(2 * 21, 384, 8, 128, False, torch.bfloat16, DEVICE, g)
    bias = torch.randn(37, generator=g).to(DEVICE)
    x = torch.randn(m, 384, generator=g).to(DEVICE)
    for cfg in (Config(16, 128, 3, dot=True), Config(32, 128, 1, dot=True)):
        out = w8a16_gemv.w8a16_gemv(x, qw, s, z, 128, bias, cfg)
        assert rel(out, wna16_reference(x, qw, s, z, 8, 128, bias)) < 1e-5, cfg
        x16 = x.to(torch.bfloat16)
        out = w8a16_gemv.w8a16_gated_gemv(x16, *gate_up, 128, cfg)
        assert rel(out, wna16_reference(x16, *gate_up, 8, 128, gated=True)) < 1e-2, cfg


@pytest.mark.gpu
def test_rows_past_sixteen_only_where_tuned(monkeypatch):
    qw, s, _ = random_wn(4096, 13696, 8, 128, True, torch.bfloat16, "cuda", gen())
    x = torch.randn(32, 13696, device="cuda", dtype=torch.bfloat16)
    assert w8a16_gemv.supports(x[:16], qw, s, 8, 128)
    assert not w8a16_gemv.supports(x, qw, s, 8, 128)
    monkeypatch.setitem(w8a16_gemv.TUNED, ("linear", 32, 4096, 13696, 128),
                        Config(64, 128, 2, dot=True))
    assert w8a16_gemv.supports(x, qw, s, 8, 128)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 5])
def test_w8a16_gemv_with_16_bit_activations_and_gating(dtype, m):
    """16-bit x (read as int32 pairs on CUDA cores), the untuned default config, and the gated
    variant with split-K, against the unfused path's rounding points."""
    g = gen()
    qw, s, z = random_wn(2 * 21, 512, 8, 64, True, dtype, DEVICE, g)
    x = torch.randn(m, 512, generator=g).to(DEVICE, dtype)
    out = w8a16_gemv.w8a16_gemv(x, qw, s, z, 64)
    assert out.dtype == dtype and rel(out, wna16_reference(x, qw, s, z, 8, 64)) < 1e-2
    for cfg in (None, Config(16, 128, 2, dot=m > 1), Config(8, 256, 2, dot=False)):
        out = w8a16_gemv.w8a16_gated_gemv(x, qw, s, z, 64, cfg)
        assert out.shape == (m, 21)
        assert rel(out, wna16_reference(x, qw, s, z, 8, 64, gated=True)) < 1e-2, cfg


def test_w8a16_gemv_reads_an_odd_offset_view_of_bf16_activations():
    """The CUDA-core path reads bf16 x as int32 pairs: a row view starting at an odd element is
    copied first, not misread."""
    g = gen()
    qw, s, z = random_wn(37, 256, 8, 64, True, torch.bfloat16, DEVICE, g)
    x = torch.randn(257, generator=g).to(DEVICE, torch.bfloat16)[1:].view(1, 256)
    assert x.storage_offset() == 1
    out = w8a16_gemv.w8a16_gemv(x, qw, s, z, 64, None, Config(32, 128, 1))
    assert rel(out, wna16_reference(x, qw, s, z, 8, 64)) < 1e-2


def test_start_up_check_passes_and_catches_a_wrong_kernel(monkeypatch):
    assert kernel_checks.check_wna16_gemv(torch.device(DEVICE), torch.bfloat16, 8)
    # a kernel whose output has the right shape and dtype but wrong values
    monkeypatch.setattr(w8a16_gemv, "w8a16_gemv",
                        lambda x, qw, s, z, g, b=None, c=None: torch.zeros(
                            x.shape[0], qw.shape[0], dtype=x.dtype, device=x.device))
    try:
        assert not kernel_checks.check_wna16_gemv(torch.device(DEVICE), torch.bfloat16, 8)
        assert not w8a16_gemv.ENABLED
    finally:
        w8a16_gemv.ENABLED = True


@pytest.mark.gpu
def test_the_linear_method_takes_the_8_bit_gemv_for_a_few_rows_only(monkeypatch):
    """cuda_linear's choice: 8-bit codes at 1..16 rows go to the 8-bit GEMV (never the 4-bit
    one), more rows to dequantize + cuBLAS; all three agree with the reference."""
    calls, real = [], w8a16_gemv.w8a16_gemv

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(w8a16_gemv, "w8a16_gemv", counted)
    qw, s, z = random_wn(4096, 13696, 8, 128, True, torch.bfloat16, "cuda", gen())
    assert not w4a16_gemv.supports(torch.randn(1, 13696, device="cuda"), qw, s, 8, 128)
    for m, gemv_calls in ((1, 1), (16, 2), (17, 2)):
        x = torch.randn(m, 13696, device="cuda", dtype=torch.bfloat16)
        out = wna16.cuda_linear(x, qw, s, z, 8, 128)
        assert len(calls) == gemv_calls, m
        assert rel(out, wna16_reference(x, qw, s, z, 8, 128)) < 1e-2, m


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_w8a16_gemv_at_the_model_shapes(dtype):
    """The compiled kernel (inline PTX loads, the byte-in-mantissa trick in registers) at
    AutoGLM's down, gate_up (gated) and qkv shapes, groups of 128 and 32, 1 to 64 rows."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for n, k, gated in ((4096, 13696, False), (13696, 4096, True), (4608, 4096, False)):
        for group in (128, 32):
            qw, s, z = random_wn(2 * n if gated else n, k, 8, group, True, dtype, "cuda", g)
            for m in (1, 2, 8, 16, 32, w8a16_gemv.WIDE_MAX_ROWS):
                x = torch.randn(m, k, generator=g, device="cuda").to(dtype)
                want = wna16_reference(x, qw, s, z, 8, group, gated=gated)
                configs = ([None, Config(64, 256, 2, dot=m > 1)] if m <= w8a16_gemv.MAX_ROWS
                           else [Config(64, 128, 2, dot=True), Config(32, 128, 4, dot=True)])
                if m <= 2:      # CUDA cores hold every row's products: one or two rows only
                    configs.append(Config(128, 128, 4, dot=False))
                for cfg in configs:
                    out = (w8a16_gemv.w8a16_gated_gemv(x, qw, s, z, group, cfg) if gated
                           else w8a16_gemv.w8a16_gemv(x, qw, s, z, group, None, cfg))
                    assert rel(out, want) < 1e-2, (n, k, group, m, cfg)

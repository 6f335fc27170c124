"""The quantized decode GEMVs (kernels/w4a16_gemv.py, kernels/fp8_gemv.py) and the fused FP8
activation quantization (kernels/fp8_quant.py) against dequantize-then-matmul: on CPU in the
Triton interpreter at small shapes spanning partial tiles, partial K chunks, every group size,
zeros or not, bias, gating, split-K and both multi-row paths; on CUDA the start-up check and the
layers' dispatch."""
import pytest
import torch

pytest.importorskip("triton")
from autoglm_serve.kernels import fp8_gemv, fp8_quant, fused_ops, w4a16_gemv  # noqa: E402
from autoglm_serve.kernels.gemv import GemvConfig as Config  # noqa: E402
from autoglm_serve.quantization import fp8, kernel_checks  # noqa: E402
from autoglm_serve.quantization.kernel_checks import (  # noqa: E402
    fp8_reference, random_fp8, random_w4, w4a16_reference)
from triton_kernel_tests import DEVICE, rel, require_gpu_or_interpreter  # noqa: E402

require_gpu_or_interpreter()
pytestmark = pytest.mark.usefixtures("triton_interpreter_fixes")


def gen():
    return torch.Generator().manual_seed(0)


# K = 320: BLOCK_K 64 / 128 / 256 leave a partial last chunk; N = 37 a partial tile. Group 32
# and 64 against BLOCK_K 128 put several groups in a tile, group 128 against BLOCK_K 64 several
# tiles in a group.
W4_CONFIGS = {1: [Config(16, 64, 1), Config(8, 256, 2, dot=False)],
              3: [Config(16, 128, 3, dot=True), Config(8, 64, 2, dot=False)],
              8: [Config(16, 128, 1, dot=True), Config(4, 64, 2, dot=False)],
              16: [Config(16, 128, 2, dot=True)]}


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_w4a16_gemv_matches_dequantized_matmul(group, zeros, m):
    """fp32 activations, bf16 scales: the dequantized weights are exact, so only the fp32
    summation order differs from the reference."""
    k = 320 if group != 128 else 384       # K a multiple of the group
    g = gen()
    qw, s, z = random_w4(37, k, group, zeros, torch.bfloat16, DEVICE, g)
    x = torch.randn(m, k, generator=g).to(DEVICE)
    bias = torch.randn(37, generator=g).to(DEVICE)
    for cfg in W4_CONFIGS[m]:
        out = w4a16_gemv.w4a16_gemv(x, qw, s, z, group, bias if zeros else None, cfg)
        assert out.shape == (m, 37) and out.dtype == torch.float32
        assert rel(out, w4a16_reference(x, qw, s, z, group, bias if zeros else None)) < 1e-5, cfg


@pytest.mark.parametrize("m", [17, 33, w4a16_gemv.WIDE_MAX_ROWS])
def test_w4a16_gemv_past_sixteen_rows(m):
    """Decode batches of 17..WIDE_MAX_ROWS rows on tensor cores, with split-K (its partials'
    workspace holds the rows bucket, 32 or 64; one of 16 rows would be overrun), bias and
    gating."""
    g = gen()
    qw, s, z = random_w4(37, 384, 128, True, torch.bfloat16, DEVICE, g)
    gate_up = random_w4(2 * 21, 384, 128, False, torch.bfloat16, DEVICE, g)
    bias = torch.randn(37, generator=g).to(DEVICE)
    x = torch.randn(m, 384, generator=g).to(DEVICE)
    for cfg in (Config(16, 128, 3, dot=True), Config(32, 128, 1, dot=True)):
        out = w4a16_gemv.w4a16_gemv(x, qw, s, z, 128, bias, cfg)
        assert out.shape == (m, 37)
        assert rel(out, w4a16_reference(x, qw, s, z, 128, bias)) < 1e-5, cfg
        x16 = x.to(torch.bfloat16)
        out = w4a16_gemv.w4a16_gated_gemv(x16, *gate_up, 128, cfg)
        assert rel(out, w4a16_reference(x16, *gate_up, 128, gated=True)) < 1e-2, cfg


@pytest.mark.parametrize("m", [1, 3])
def test_w4a16_gated_gemv_matches_two_step_path(m):
    g = gen()
    qw, s, z = random_w4(2 * 21, 256, 64, True, torch.bfloat16, DEVICE, g)
    x = torch.randn(m, 256, generator=g).to(DEVICE, torch.bfloat16)
    for cfg in (None, Config(16, 128, 2, dot=m > 1), Config(8, 64, 2)):
        out = w4a16_gemv.w4a16_gated_gemv(x, qw, s, z, 64, cfg)
        assert out.shape == (m, 21) and out.dtype == torch.bfloat16
        assert rel(out, w4a16_reference(x, qw, s, z, 64, gated=True)) < 1e-2


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("m", [1, 3])
def test_w4a16_gemv_in_bf16_pairs(group, zeros, m):
    """packed: bf16 activations multiplied in bf16 pairs, each word's nibbles k and k + 4 against
    activations k and k + 4, one or two words a sum (in the interpreter the same sums in fp32:
    this checks the pairing, the zero points, the scales a word or a row, and the tiles; the PTX
    runs in the GPU test below). Partial K tiles and a partial N tile, split-K, gated too. On a
    GPU a sum of one or two words' pair products runs in bf16 (8-bit mantissas): 5.5e-3 to
    1.1e-2 from the fp32 reference on an H100 at these short rows (K 320-384)."""
    k = 320 if group != 128 else 384
    g = gen()
    qw, s, z = random_w4(2 * 37, k, group, zeros, torch.bfloat16, DEVICE, g)
    x = torch.randn(m, k, generator=g).to(DEVICE, torch.bfloat16)
    for cfg in (Config(8, 64, 2, packed=1), Config(16, 128, 1, packed=1),
                Config(8, 256, 2, packed=1), Config(8, 64, 2, packed=2),
                Config(16, 128, 1, packed=2), Config(8, 256, 2, packed=2)):
        out = w4a16_gemv.w4a16_gemv(x, qw[:37], s[:37], z[:37] if zeros else None, group,
                                    None, cfg)
        want = w4a16_reference(x, qw[:37], s[:37], z[:37] if zeros else None, group)
        assert out.dtype == torch.bfloat16 and rel(out, want) < 2e-2, cfg
        out = w4a16_gemv.w4a16_gated_gemv(x, qw, s, z if zeros else None, group, cfg)
        want = w4a16_reference(x, qw, s, z if zeros else None, group, gated=True)
        assert rel(out, want) < 2e-2, cfg
    # other activation dtypes take the CUDA-core path as if packed were off
    x32 = x.float()
    out = w4a16_gemv.w4a16_gemv(x32, qw[:37], s[:37], z[:37] if zeros else None, group, None,
                                Config(8, 64, 2, packed=2))
    assert rel(out, w4a16_reference(x32, qw[:37], s[:37], z[:37] if zeros else None,
                                    group)) < 1e-5


def test_w4a16_gemv_with_fp32_scales():
    """Scales of 24 significant bits make the in-register dequantization round (~1e-5)."""
    g = gen()
    qw, s, z = random_w4(37, 256, 64, True, torch.float32, DEVICE, g)
    x = torch.randn(2, 256, generator=g).to(DEVICE)
    out = w4a16_gemv.w4a16_gemv(x, qw, s, z, 64, None, Config(16, 128, 2, dot=False))
    assert rel(out, w4a16_reference(x, qw, s, z, 64)) < 1e-4


def test_w4a16_default_config_in_bf16_at_a_model_shape_slice():
    """The default config (BLOCK_K 512, split-K) on a K of AutoGLM's down projection."""
    g = gen()
    qw, s, z = random_w4(20, 13696, 128, True, torch.bfloat16, DEVICE, g)
    x = torch.randn(1, 13696, generator=g).to(DEVICE, torch.bfloat16)
    out = w4a16_gemv.w4a16_gemv(x, qw, s, z, 128)
    assert rel(out, w4a16_reference(x, qw, s, z, 128)) < 1e-2


FP8_CONFIGS = {1: [Config(16, 64, 1), Config(8, 128, 3)],
               3: [Config(16, 64, 2, dot=True)],
               8: [Config(32, 128, 1, dot=True)]}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_fp8_gemv_keeps_w8a8_numerics(bias, m):
    """Per-token activation quantization inside the kernel: the same e4m3 products as
    _scaled_mm's, so only the fp32 summation order differs."""
    g = gen()
    w, ws = random_fp8(37, 200, DEVICE, g)
    x = (torch.randn(m, 200, generator=g) * torch.logspace(-2, 1, m)[:, None]).to(DEVICE,
                                                                                torch.bfloat16)
    b = torch.randn(37, generator=g).to(DEVICE, torch.bfloat16) if bias else None
    want = fp8_reference(x, w, ws, b)
    for cfg in FP8_CONFIGS[m]:
        out = fp8_gemv.fp8_gemv(x, w, ws, b, cfg)
        assert out.shape == (m, 37) and out.dtype == torch.bfloat16
        assert rel(out, want) < 5e-3, cfg
    # and the layer path the GEMV replaces (torch's _scaled_mm on CPU) agrees as closely
    assert rel(fp8.fp8_linear(x, w, ws, b), want) < 5e-3


@pytest.mark.parametrize("packed", fp8_gemv.PACKED_WORDS)
@pytest.mark.parametrize("gated", [False, True])
def test_fp8_gemv_in_f16_pairs(packed, gated):
    """One row on CUDA cores in f16 pairs: 4 e4m3 weights a word, the activations quantized
    in pairs and scaled by PAIR_SCALE, 1, 2 or 4 words a sum (in the interpreter the same
    sums in fp32: this checks the words, the pairs, the scales and the tiles; the PTX runs in
    the GPU test below). K = 200: a partial last K tile at BLOCK_K 64 and 128; N = 37 a
    partial N tile; split-K; activations over three decades."""
    g = gen()
    w, ws = random_fp8(2 * 37 if gated else 37, 200, DEVICE, g)
    for scale in (0.01, 1.0, 30.0):
        x = (torch.randn(1, 200, generator=g) * scale).to(DEVICE, torch.bfloat16)
        want = fp8_reference(x, w, ws, gated=gated)
        for cfg in (Config(16, 64, 1, packed=packed), Config(8, 128, 2, packed=packed)):
            out = (fp8_gemv.fp8_gated_gemv(x, w, ws, cfg) if gated
                   else fp8_gemv.fp8_gemv(x, w, ws, None, cfg))
            assert out.shape == (1, 37) and out.dtype == torch.bfloat16
            assert rel(out, want) < 5e-3, (scale, cfg)
    # fp16 activations: their pairs unpacked as f16
    cfg = Config(8, 128, 2, packed=packed)
    x16 = x.to(torch.float16)
    out = (fp8_gemv.fp8_gated_gemv(x16, w, ws, cfg) if gated
           else fp8_gemv.fp8_gemv(x16, w, ws, None, cfg))
    assert out.dtype == torch.float16
    assert rel(out, fp8_reference(x16, w, ws, gated=gated)) < 5e-3
    # given the norm's amax, the same bits
    amax = x.float().abs().amax(dim=-1)
    assert torch.equal(fp8_gemv.fp8_gemv(x, w[:37], ws[:37], None, cfg, row_amax=amax),
                       fp8_gemv.fp8_gemv(x, w[:37], ws[:37], None, cfg))


def test_fp8_gemv_amax_in_chunks_wider_than_the_tile():
    """One row at down's K behind 1024-wide tiles: the amax pass reads 8192 activations a
    chunk, the second one masked past K; the row's largest value sits there, so a scale from
    the first chunk alone would saturate it."""
    assert fp8_gemv.amax_block(13696, Config(8, 1024, 2)) == 8192
    g = gen()
    w, ws = random_fp8(24, 13696, DEVICE, g)
    x = torch.randn(1, 13696, generator=g)
    x[0, 13000] = 40.0
    x = x.to(DEVICE, torch.bfloat16)
    out = fp8_gemv.fp8_gemv(x, w, ws, None, Config(8, 1024, 2))
    assert rel(out, fp8_reference(x, w, ws)) < 5e-3


@pytest.mark.parametrize("m", [1, 3])
def test_fp8_gemv_divides_by_the_scale_as_quantize_rows(m):
    """bf16 rows whose amax is 3.875: x * (1 / scale) and x / scale round ~0.7% of the elements
    to different e4m3 values (1% of the product); the kernel divides as the reference does, so
    only the bf16 output rounding (~1e-3) and summation order are left."""
    g = gen()
    w, ws = random_fp8(256, 4096, DEVICE, g)
    x = torch.randn(m, 4096, generator=g).clamp(-3.8, 3.8)
    x[:, 7] = 3.875
    x = x.to(DEVICE, torch.bfloat16)
    out = fp8_gemv.fp8_gemv(x, w, ws, None, Config(16, 512, 1, dot=m > 1))
    assert rel(out, fp8_reference(x, w, ws)) < 2e-3


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("m", [1, 3])
def test_fp8_gemv_given_the_row_amax_is_bitwise_its_own_pass(m, gated):
    """The amax a fused norm computes on the way replaces the kernel's pass over x: the same
    scale, the same quantized rows, the same bits out (one row on CUDA cores, several on
    tensor cores, split-K)."""
    g = gen()
    w, ws = random_fp8(2 * 24 if gated else 40, 512, DEVICE, g)
    x = (torch.randn(m, 512, generator=g) * torch.logspace(-2, 1, m)[:, None]).to(
        DEVICE, torch.bfloat16)
    amax = x.float().abs().amax(dim=-1)
    cfg = Config(16, 128, 2, dot=m > 1)
    if gated:
        own = fp8_gemv.fp8_gated_gemv(x, w, ws, cfg)
        given = fp8_gemv.fp8_gated_gemv(x, w, ws, cfg, row_amax=amax)
    else:
        own = fp8_gemv.fp8_gemv(x, w, ws, None, cfg)
        given = fp8_gemv.fp8_gemv(x, w, ws, None, cfg, row_amax=amax)
    assert torch.equal(given, own)
    # and the amax is what sets the scale: a wrong one changes the result
    assert not torch.equal(fp8_gemv.fp8_gemv(x, w[:40], ws[:40], None, cfg, row_amax=amax * 3),
                           fp8_gemv.fp8_gemv(x, w[:40], ws[:40], None, cfg))


@pytest.mark.parametrize("m", [1, 3])
def test_fp8_gated_gemv_matches_two_step_path(m):
    g = gen()
    w, ws = random_fp8(2 * 24, 256, DEVICE, g)
    x = torch.randn(m, 256, generator=g).to(DEVICE, torch.bfloat16)
    out = fp8_gemv.fp8_gated_gemv(x, w, ws, Config(16, 64, 2, dot=m > 1))
    assert out.shape == (m, 24)
    assert rel(out, fp8_reference(x, w, ws, gated=True)) < 1e-2


def test_fused_activation_quantization_is_bitwise_the_torch_ops():
    g = gen()
    x = (torch.randn(5, 1000, generator=g) * torch.logspace(-3, 2, 5)[:, None]).to(
        DEVICE, torch.bfloat16)
    x[2] = 0                           # an all-zero row: the minimum scale
    q, s = fp8_quant.quantize_rows(x)
    q_ref, s_ref = fp8.quantize_rows(x)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("rows", [2, 6])
def test_the_norm_pairs_fp8_rows_are_bitwise_the_torch_quantization(rows):
    """GLM's fused norm pair writes qkv's and gate_up's FP8 input on the way: the codes and
    scales of the torch ops on its own 16-bit output (an all-zero row: the minimum scale), and
    each row's amax. (One row gets the amax alone: the FP8 GEMV quantizes it.)"""
    g = gen()
    x = (torch.randn(rows, 1000, generator=g) * torch.logspace(-3, 2, rows)[:, None]).to(
        DEVICE, torch.bfloat16)
    w = (torch.rand(1000, generator=g) + 0.5).to(DEVICE, torch.bfloat16)
    residual = torch.randn(rows, 1000, generator=g).to(DEVICE, torch.bfloat16)
    x[-1] = residual[-1] = 0        # the norm's output row is all zero
    out, _, fp8_rows = fused_ops.rms_norm_pair(x, residual, w, 1e-5, w, 1e-6, fp8=True)
    q_ref, s_ref = fp8.quantize_rows(out)
    assert fp8_rows.codes.shape == (rows, 1000) and fp8_rows.scale.shape == (rows, 1)
    assert torch.equal(fp8_rows.scale, s_ref)
    assert torch.equal(fp8_rows.codes.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(fp8_rows.amax, out.float().abs().amax(dim=-1))
    assert s_ref[-1].item() == torch.tensor(1e-12).item()


@pytest.mark.parametrize("d", [1000, 10000, 20000])
def test_silu_and_mul_quantization_is_bitwise_the_two_kernels(d):
    """down_proj's input quantized as SiLU-and-mul computes it: the codes and scales of the
    SiLU kernel's product quantized after it. d = 1,000 and 10,000: the row in one tile, part
    of it masked; 20,000: past ONE_TILE_MAX, two passes over 8,192-column chunks, the last one
    partial."""
    assert 10000 <= fp8_quant.ONE_TILE_MAX < 20000
    g = gen()
    x = (torch.randn(5, 2 * d, generator=g) * torch.logspace(-2, 2, 5)[:, None]).to(
        DEVICE, torch.bfloat16)
    x[3] = 0
    q, s = fp8_quant.silu_and_mul_quantize(x)
    q_ref, s_ref = fp8_quant.quantize_rows(fused_ops.silu_and_mul(x))
    assert s.shape == (5, 1) and q.shape == (5, d)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.gpu
def test_fp8_down_proj_takes_its_input_quantized_by_the_silu_kernel(monkeypatch):
    """An FP8 down_proj given [gate | up]: where the GEMV does not take the rows (AutoGLM's
    down: two rows and more) one kernel makes its e4m3 input, and the output is bit for bit the
    SiLU kernel's product through fp8_linear."""
    g = torch.Generator(device="cuda").manual_seed(0)
    w, ws = random_fp8(4096, 13696, "cuda", g)
    fused = []
    kernel = fp8_quant.silu_and_mul_quantize
    monkeypatch.setattr(fp8_quant, "silu_and_mul_quantize", lambda x: fused.append(x) or kernel(x))
    for m in (1, 2, 40):
        fused.clear()
        gate_up = torch.randn(m, 2 * 13696, generator=g, device="cuda").to(torch.bfloat16)
        out = fp8.fp8_linear_of_silu_and_mul(gate_up, w, ws, None)
        assert torch.equal(out, fp8.fp8_linear(fused_ops.silu_and_mul(gate_up), w, ws, None))
        assert len(fused) == (m > 1), m


def _one_shape_per_config(table: dict) -> dict:
    """A tuned table cut to one shape for each distinct (kind, config): its smallest K."""
    kept = {}
    for key, cfg in sorted(table.items(), key=lambda item: item[0][3]):
        if cfg is not None:
            kept.setdefault((key[0], cfg), (key, cfg))
    return dict(kept.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_start_up_checks_pass(dtype, monkeypatch):
    """Every path the start-up check covers agrees. In the interpreter on CPU (every tuned
    shape at full K: 2.5 minutes a dtype) bf16 runs each distinct tuned config once, at its
    smallest K, and fp16 the untuned paths: the kernels do not differ by dtype."""
    if DEVICE == "cpu":
        cut = _one_shape_per_config if dtype == torch.bfloat16 else (lambda table: {})
        monkeypatch.setattr(w4a16_gemv, "TUNED", cut(w4a16_gemv.TUNED))
        monkeypatch.setattr(fp8_gemv, "TUNED", cut(fp8_gemv.TUNED))
    try:
        assert kernel_checks.check_wna16_gemv(torch.device(DEVICE), dtype, 4)
        assert kernel_checks.check_fp8_gemv(torch.device(DEVICE), dtype)
        assert kernel_checks.check_fp8_quant(torch.device(DEVICE), dtype)
    finally:
        w4a16_gemv.ENABLED = fp8_gemv.ENABLED = fp8_quant.ENABLED = True


@pytest.mark.parametrize("kernel,name,wrong,check", [
    (w4a16_gemv, "w4a16_gemv", lambda x, qw, s, z, g, b=None, c=None:
     torch.zeros(x.shape[0], qw.shape[0], dtype=x.dtype, device=x.device),
     lambda device, dtype: kernel_checks.check_wna16_gemv(device, dtype, 4)),
    (fp8_quant, "silu_and_mul_quantize",       # the gate half quantized, not the product
     lambda x: fp8_quant.quantize_rows(x[:, : x.shape[1] // 2]), kernel_checks.check_fp8_quant),
], ids=["w4a16_gemv", "silu_and_mul_quantize"])
def test_start_up_check_switches_a_wrong_kernel_off(monkeypatch, kernel, name, wrong, check):
    monkeypatch.setattr(kernel, name, wrong)
    try:
        assert not check(torch.device(DEVICE), torch.bfloat16)
        assert not kernel.ENABLED
    finally:
        kernel.ENABLED = True


@pytest.mark.gpu
def test_layers_take_the_gemvs_for_a_few_rows_only(monkeypatch):
    x1 = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    x32 = torch.randn(32, 4096, device="cuda", dtype=torch.bfloat16)
    qw, s, _ = random_w4(4608, 4096, 128, False, torch.bfloat16, "cuda", gen())
    assert w4a16_gemv.supports(x1, qw, s, 4, 128)
    assert w4a16_gemv.supports(x32[:16], qw, s, 4, 128)
    assert not w4a16_gemv.supports(x32, qw, s, 4, 128)    # 17+ rows: only where measured
    monkeypatch.setitem(w4a16_gemv.TUNED, ("linear", 32, 4608, 4096, 128),
                        Config(64, 128, 2, dot=True))
    assert w4a16_gemv.supports(x32, qw, s, 4, 128)
    assert not w4a16_gemv.supports(torch.randn(40, 4096, device="cuda", dtype=torch.bfloat16),
                                   qw, s, 4, 128)     # 33..64 rows: not measured here
    assert rel(w4a16_gemv.w4a16_gemv(x32, qw, s, None, 128),
               w4a16_reference(x32, qw, s, None, 128)) < 1e-2
    w, ws = random_fp8(4608, 4096, "cuda", gen())
    assert fp8_gemv.supports(x1, w) and not fp8_gemv.supports(x32, w)
    assert rel(fp8.fp8_linear(x32, w, ws, None), fp8_reference(x32, w, ws)) < 1e-2
    assert rel(fp8.fp8_linear(x1, w, ws, None), fp8_reference(x1, w, ws)) < 1e-2


def test_gemvs_read_an_odd_offset_view_of_16_bit_activations():
    """The CUDA-core W4A16 path and the FP8 f16-pair path read 16-bit x as int32 pairs: a row
    view starting at an odd element (no int32 view of it) is copied first, not misread."""
    g = gen()
    qw, s, z = random_w4(37, 256, 64, True, torch.bfloat16, DEVICE, g)
    x = torch.randn(257, generator=g).to(DEVICE, torch.bfloat16)[1:].view(1, 256)
    assert x.storage_offset() == 1 and x.is_contiguous()
    out = w4a16_gemv.w4a16_gemv(x, qw, s, z, 64, None, Config(32, 128, 1))
    assert rel(out, w4a16_reference(x, qw, s, z, 64)) < 1e-2
    w, ws = random_fp8(37, 256, DEVICE, g)
    out = fp8_gemv.fp8_gemv(x, w, ws, None, Config(8, 128, 1, packed=2))
    assert rel(out, fp8_reference(x, w, ws)) < 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compiled_gemvs_at_the_model_shapes(dtype):
    """The compiled paths the interpreter cannot run (inline PTX loads, 16-bit bit tricks and
    packed arithmetic in bf16 and f16 pairs, e4m3 tensor cores) on AutoGLM's gate_up, down and
    qkv shapes."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for n, k, gated in ((13696, 4096, True), (4096, 13696, False), (4608, 4096, False)):
        rows = 2 * n if gated else n
        qw, s, z = random_w4(rows, k, 128, True, dtype, "cuda", g)
        w, ws = random_fp8(rows, k, "cuda", g)
        for m in (1, 2, 8, 16, 32, w4a16_gemv.WIDE_MAX_ROWS):
            x = torch.randn(m, k, generator=g, device="cuda").to(dtype)
            want = w4a16_reference(x, qw, s, z, 128, gated=gated)
            want8 = fp8_reference(x, w, ws, gated=gated)
            w4_configs = [None, Config(128, 128, 2, dot=True)]
            if m > w4a16_gemv.MAX_ROWS:     # decode batches of 32-64 (where TUNED takes them)
                tuned = w4a16_gemv.TUNED.get(w4a16_gemv._tuned_key(m, n, k, 128, gated))
                w4_configs = [Config(64, 128, 2, dot=True), Config(32, 128, 4, dot=True)] + \
                    ([tuned] if tuned else [])
            if m <= 2:
                w4_configs += [Config(256, 128, 2, dot=False), Config(256, 128, 2, packed=1),
                               Config(256, 128, 2, packed=2)]
            for cfg in w4_configs:
                out = (w4a16_gemv.w4a16_gated_gemv(x, qw, s, z, 128, cfg) if gated
                       else w4a16_gemv.w4a16_gemv(x, qw, s, z, 128, None, cfg))
                assert rel(out, want) < 1e-2, (n, k, m, cfg)
            f8_configs = (None, Config(128, 256, 2, dot=True)) if m <= fp8_gemv.MAX_ROWS else ()
            if m == 1:
                f8_configs += tuple(Config(8, 512, 1, packed=p) for p in fp8_gemv.PACKED_WORDS)
            for cfg in f8_configs:
                out = (fp8_gemv.fp8_gated_gemv(x, w, ws, cfg) if gated
                       else fp8_gemv.fp8_gemv(x, w, ws, None, cfg))
                assert rel(out, want8) < 1e-2, (n, k, m, cfg)

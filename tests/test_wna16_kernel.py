"""The W4A16/W8A16 Triton kernel (kernels/wna16.py) against dequantize-then-matmul, and the FP8
GEMM against the product of its dequantized operands: on CPU in the Triton interpreter at small
shapes that span partial tiles and every group size, on CUDA at AutoGLM-Phone-9B's shapes and
inside a CUDA graph."""
import gc

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from autoglm_serve.kernels.wna16 import WNA16Config, select_config, wna16_linear  # noqa: E402
from autoglm_serve.quantization.fp8 import fp8_linear, quantize_rows  # noqa: E402
from autoglm_serve.quantization.packing import pack_last_dim  # noqa: E402
from autoglm_serve.quantization.wna16 import dequantize  # noqa: E402
from triton_kernel_tests import DEVICE, rel, require_gpu_or_interpreter  # noqa: E402

require_gpu_or_interpreter()
pytestmark = pytest.mark.usefixtures("triton_interpreter_fixes")


def random_quantized(n, k, bits, group, zeros, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 1 << bits, (n, k), generator=g)
    scales = (torch.rand(n, k // group, generator=g) * 0.02 + 0.001).to(dtype)
    z = torch.randint(0, 1 << bits, (n, k // group), generator=g, dtype=torch.uint8) if zeros else None
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return to(pack_last_dim(q, bits)), to(scales), to(z)


def check(m, n, k, bits, group, zeros, dtype, bias, config=None):
    qw, s, z = random_quantized(n, k, bits, group, zeros, dtype)
    x = torch.randn(m, k, dtype=dtype, device=DEVICE)
    b = torch.randn(n, dtype=dtype, device=DEVICE) if bias else None
    out = wna16_linear(x, qw, s, z, bits, group, b, config)
    ref = F.linear(x.float(), dequantize(qw, s, z, bits, torch.float32), None if b is None else b.float())
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


# N = 40 (a partial tile), K = 256 spanning several K tiles. A K tile inside one group takes the
# one-scale-per-tile path; a tile of whole groups (BLOCK_K 64/128 against group 32 or 64) the
# broadcast path; the test after this one the per-element path (neither divides the other).
CONFIGS = [WNA16Config(16, 32, 32), WNA16Config(32, 16, 64), WNA16Config(16, 16, 128)]


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("bits,zeros", [(4, False), (4, True), (8, True)])
@pytest.mark.parametrize("m", [1, 37])
def test_kernel_matches_dequantized_matmul(group, bits, zeros, m):
    for cfg in CONFIGS:
        check(m, 40, 256, bits, group, zeros, torch.float32, bias=m == 37, config=cfg)


def test_kernel_where_tiles_and_groups_do_not_nest():
    check(3, 40, 192, 4, 96, True, torch.float32, bias=False, config=WNA16Config(16, 16, 64))


@pytest.mark.parametrize("m", [1, 20])
def test_kernel_in_bf16_with_default_configs(m):
    check(m, 48, 256, 4, 128, True, torch.bfloat16, bias=True)


def test_default_configs_keep_k_tiles_inside_groups():
    for m in (1, 16, 64, 4096):
        for group in (32, 64, 128, 4096, 13696):
            bk = select_config(m, 4096, 13696, group).block_k
            assert group % bk == 0 or bk % group == 0


# (K, group): tiles of whole groups (32, 128: the 256-wide tile's last one partial), one group
# a tile (512 in K = 1,024; the whole row, 384), and groups that straddle tiles (96)
@pytest.mark.parametrize("k,group", [(384, 32), (384, 128), (1024, 512), (384, 384), (384, 96)])
@pytest.mark.parametrize("bits,zeros", [(4, False), (4, True), (8, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill_dequantization_equals_the_reference(k, group, bits, zeros, dtype):
    """The weight that prefill hands to cuBLAS (kernels/wna16_dequant.py) is the reference
    dequantization bit for bit, over partial tiles (N = 40)."""
    from autoglm_serve.kernels import wna16_dequant
    qw, s, z = random_quantized(40, k, bits, group, zeros, dtype)
    got = wna16_dequant.dequantize(qw, s, z, bits, group, dtype)
    assert torch.equal(got, dequantize(qw, s, z, bits, dtype))


def test_prefill_dequantization_shares_one_growing_buffer():
    """Layers share the scratch buffer: a smaller layer after a larger one reads its own
    values, and a larger one grows the buffer."""
    from autoglm_serve.kernels import wna16_dequant
    small, large = random_quantized(16, 128, 4, 32, True, torch.bfloat16, seed=1), \
        random_quantized(48, 256, 4, 32, True, torch.bfloat16, seed=2)
    wna16_dequant._scratch.clear()
    big = wna16_dequant.dequantize(*large, 4, 32, torch.bfloat16)
    assert torch.equal(big, dequantize(*large, 4, torch.bfloat16))
    little = wna16_dequant.dequantize(*small, 4, 32, torch.bfloat16)
    assert little.data_ptr() == big.data_ptr()
    assert torch.equal(little, dequantize(*small, 4, torch.bfloat16))
    wna16_dequant._scratch.clear()
    wna16_dequant.dequantize(*small, 4, 32, torch.bfloat16)
    grown = wna16_dequant.dequantize(*large, 4, 32, torch.bfloat16)
    assert torch.equal(grown, dequantize(*large, 4, torch.bfloat16))


def test_fp8_gemm_is_exact_against_its_dequantized_operands():
    x = torch.randn(5, 64, device=DEVICE)
    w = torch.randn(48, 64, device=DEVICE) * 0.1
    wq, ws = quantize_rows(w)
    xq, xs = quantize_rows(x)
    out = fp8_linear(x, wq, ws.view(-1), None)
    # exact on a CPU; cuBLASLt's FP8 GEMM on an H200 gave 7-9e-5 with a float32 output
    assert rel(out, F.linear(xq.float() * xs, wq.float() * ws)) < (1e-5 if DEVICE == "cpu"
                                                                  else 2e-4)
    assert 1e-3 < rel(out, F.linear(x, w)) < 0.1     # and e4m3 is an approximation


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_gemm_adds_the_bias(dtype):
    """A 16-bit bias goes in _scaled_mm's epilogue where torch takes it there (the CPU's
    does); with a float32 output (which torch's row-wise FP8 GEMM refuses a bias with on CUDA)
    it is added after. Both as the reference."""
    from autoglm_serve.quantization.fp8 import epilogue_bias_works
    if DEVICE == "cpu":     # torch 2.13's CPU _scaled_mm takes a bf16 bias in its epilogue
        assert epilogue_bias_works(torch.device("cpu"), dtype) == (dtype == torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g).to(DEVICE, dtype)
    w = (torch.randn(48, 64, generator=g) * 0.1).to(DEVICE)
    b = torch.randn(48, generator=g).to(DEVICE, dtype)
    wq, ws = quantize_rows(w)
    xq, xs = quantize_rows(x)
    out = fp8_linear(x, wq, ws.view(-1), b)
    assert out.dtype == dtype
    ref = F.linear(xq.float() * xs, wq.float() * ws) + b.float()
    assert rel(out.float(), ref) < (1e-2 if dtype == torch.bfloat16 else 2e-4)


def test_fp8_prompt_rows_take_fast_accumulation(monkeypatch):
    """A prompt's rows (over FAST_ACCUM_ABOVE_ROWS) ask ``_scaled_mm`` for fast accumulation,
    a decode batch's do not; both stay within the W8A8 product's tolerance."""
    from autoglm_serve.quantization import fp8
    if DEVICE == "cpu" and not fp8.cpu_scaled_mm_takes_row_scales():   # (its probe cached)
        pytest.skip("this CPU build multiplies in float32, without _scaled_mm")
    asked = []
    real = torch._scaled_mm

    def scaled_mm(*args, **kwargs):   # the real GEMM, its flag recorded
        asked.append(kwargs.get("use_fast_accum", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    monkeypatch.setattr(fp8, "_split_k_gemm", lambda *a, **kw: None)   # all on _scaled_mm
    monkeypatch.setattr(fp8, "_decode_gemv", lambda *a, **kw: None)
    g = torch.Generator().manual_seed(0)
    wq, ws = quantize_rows((torch.randn(48, 64, generator=g) * 0.1).to(DEVICE))
    for rows in (1, fp8.FAST_ACCUM_ABOVE_ROWS, fp8.FAST_ACCUM_ABOVE_ROWS + 1, 2048):
        x = torch.randn(rows, 64, generator=g).to(DEVICE, torch.bfloat16)
        asked.clear()
        out = fp8_linear(x, wq, ws.view(-1), None)
        assert asked == [rows > fp8.FAST_ACCUM_ABOVE_ROWS], rows
        xq, xs = quantize_rows(x)
        assert rel(out.float(), F.linear(xq.float() * xs, wq.float() * ws)) < 1e-2


def test_fp8_gemm_on_a_cpu_whose_scaled_mm_takes_single_scales_only(monkeypatch):
    """torch 2.11's CPU `_scaled_mm` asserts per-tensor scales: there the e4m3 values are
    multiplied in float32, the same products as `_scaled_mm` gives where it takes row scales."""
    from autoglm_serve.quantization import fp8
    x = torch.randn(5, 64)
    w = torch.randn(48, 64) * 0.1
    wq, ws = quantize_rows(w)
    monkeypatch.setattr(fp8, "cpu_scaled_mm_takes_row_scales", lambda: False)
    fallback = fp8_linear(x, wq, ws.view(-1), None)
    xq, xs = quantize_rows(x)
    assert rel(fallback, F.linear(xq.float() * xs, wq.float() * ws)) < 1e-6
    monkeypatch.undo()
    if fp8.cpu_scaled_mm_takes_row_scales():
        assert rel(fallback, fp8_linear(x, wq, ws.view(-1), None)) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(4608, 4096), (4096, 4096), (27392, 4096), (4096, 13696)])
@pytest.mark.parametrize("m", [1, 8, 256])
def test_kernel_at_model_shapes_on_cuda(n, k, m):
    check(m, n, k, 4, 128, True, torch.bfloat16, bias=n == 4608)


@pytest.mark.gpu
def test_kernel_inside_a_cuda_graph():
    qw, s, z = random_quantized(4096, 4096, 4, 128, True, torch.bfloat16)
    x = torch.randn(4, 4096, dtype=torch.bfloat16, device=DEVICE)
    eager = wna16_linear(x, qw, s, z, 4, 128)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = wna16_linear(x, qw, s, z, 4, 128)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert rel(out, wna16_linear(x, qw, s, z, 4, 128)) < 1e-6 and rel(out, eager) > 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(4608, 4096), (27392, 4096), (4096, 13696)])
@pytest.mark.parametrize("m", [1, 256])
def test_fp8_gemm_at_model_shapes_and_in_a_cuda_graph(n, k, m):
    w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.02
    wq, ws = quantize_rows(w)
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    xq, xs = quantize_rows(x)
    ref = F.linear(xq.float() * xs, wq.float() * ws)
    assert rel(fp8_linear(x, wq, ws.view(-1), None), ref) < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_linear(x, wq, ws.view(-1), None)
    graph.replay()
    assert rel(out, ref) < 1e-2


@pytest.mark.gpu
def test_engine_serves_w4a16_and_fp8_dummy_autoglm_with_cuda_graphs():
    from autoglm_serve import LLM, SamplingParams
    for method in ("compressed-tensors", "fp8"):
        llm = LLM("autoglm-phone-9b", load_format="dummy", quantization=method,
                  skip_tokenizer_init=True, max_model_len=2048, max_num_seqs=8,
                  kv_cache_dtype="fp8" if method == "fp8" else "auto")
        out = llm.generate([[1000 + i for i in range(64)]],
                           SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 16
        assert llm.engine.core.runner.graphs is not None
        llm.shutdown()
        del llm
        gc.collect()        # the engine's objects hold cycles: free its KV cache before the next
        torch.cuda.empty_cache()

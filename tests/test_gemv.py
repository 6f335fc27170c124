"""Decode GEMV kernels (kernels/gemv.py) against F.linear and the two-step gate_up + SiLU path:
on CPU in the Triton interpreter at small odd shapes, on CUDA compiled at the real
AutoGLM-Phone-9B shapes and through the model's layers and a CUDA graph."""
import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
from autoglm_serve.kernels import gemv  # noqa: E402
from autoglm_serve.models.layers.activation import SiluAndMul  # noqa: E402
from autoglm_serve.models.layers.linear import UnquantizedLinearMethod, uses_gemv  # noqa: E402
from autoglm_serve.models.llama import GatedMLP  # noqa: E402
from triton_kernel_tests import DEVICE, rel, require_gpu_or_interpreter  # noqa: E402

require_gpu_or_interpreter()
pytestmark = pytest.mark.usefixtures("triton_interpreter_fixes")
Config = gemv.GemvConfig


def tol(dtype):
    return 1e-4 if dtype == torch.float32 else 1e-2


def two_step(x, weight):
    """What GatedMLP does without the fused kernel."""
    return SiluAndMul()(F.linear(x, weight))


def rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


# Small configs so that the odd shapes below span several tiles, a partial tile and a partial
# K chunk: (N = 77, K = 203) against BLOCK_N 16/32 and BLOCK_K 32/64.
ONE_ROW = Config(16, 64)
ROWS = Config(16, 32, dot=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", range(1, gemv.MAX_ROWS + 1))
def test_gemv_matches_linear(dtype, bias, m):
    x, w = rand(m, 203, dtype=dtype), rand(77, 203, dtype=dtype)
    b = rand(77, dtype=dtype) if bias else None
    out = gemv.gemv(x, w, b, ONE_ROW if m == 1 else ROWS)
    assert out.shape == (m, 77) and out.dtype == dtype
    assert rel(out, F.linear(x, w, b)) < tol(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_gated_gemv_matches_two_step(dtype, m):
    x, w = rand(m, 203, dtype=dtype), rand(2 * 45, 203, dtype=dtype)
    out = gemv.gated_gemv(x, w, ONE_ROW if m == 1 else ROWS)
    assert out.shape == (m, 45) and out.dtype == dtype
    assert rel(out, two_step(x, w)) < tol(dtype)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("config", [Config(32, 32, split_k=3), Config(16, 32, split_k=4, dot=True),
                                    Config(32, 64, split_k=8, dot=True)])
def test_split_k_is_deterministic_and_rearms(gated, config):
    # 8 splits of 4 chunks: some splits have no K range at all. Launching twice checks that the
    # reducer resets its tile counters (a graph replay relies on it) and that the sum order is
    # fixed.
    m = 3 if config.dot else 1
    x = rand(m, 203, dtype=torch.bfloat16)
    w = rand(2 * 45 if gated else 77, 203, dtype=torch.bfloat16)

    def run():
        return gemv.gated_gemv(x, w, config) if gated else gemv.gemv(x, w, None, config)
    first, second = run(), run()
    assert torch.equal(first, second)
    assert rel(first, two_step(x, w) if gated else F.linear(x, w)) < 1e-2
    assert all(not counts.any() for _, counts in gemv._workspaces.values())


def test_rows_and_leading_dims():
    x = rand(2, 3, 64, dtype=torch.float32)      # 6 rows in a [2, 3, K] activation
    w = rand(40, 64, dtype=torch.float32)
    out = gemv.gemv(x, w, None, Config(16, 32, dot=True))
    assert out.shape == (2, 3, 40) and rel(out, F.linear(x, w)) < 1e-4


def test_supports():
    w = torch.empty(10, 64)
    assert gemv.supports(torch.empty(gemv.MAX_ROWS, 64), w, torch.empty(10))
    assert not gemv.supports(torch.empty(gemv.MAX_ROWS + 1, 64), w)      # prefill: cuBLAS
    assert not gemv.supports(torch.empty(0, 64), w)
    assert not gemv.supports(torch.empty(1, 64, dtype=torch.bfloat16), w)
    assert not gemv.supports(torch.empty(1, 64), torch.empty(64, 10).t())  # not row-major
    assert not gemv.supports(torch.empty(1, 64), w, torch.empty(10, dtype=torch.float64))
    assert not gemv.supports(torch.empty(1, 64), torch.empty(9, 64), gated=True)


def test_tuned_none_means_cublas(monkeypatch):
    w = torch.empty(10, 64, dtype=torch.bfloat16)
    monkeypatch.setitem(gemv.TUNED, ("linear", 2, 10, 64), None)
    monkeypatch.setitem(gemv.TUNED, ("gated", 4, 5, 64), Config(32, 128, dot=True))
    assert not gemv.supports(torch.empty(2, 64, dtype=torch.bfloat16), w)
    assert gemv.supports(torch.empty(1, 64, dtype=torch.bfloat16), w)
    assert gemv.supports(torch.empty(2, 64), w.float())      # fp32 never reads the table
    assert gemv.select_config(3, 5, 64, torch.bfloat16, gated=True) == Config(32, 128, dot=True)


def test_default_configs_fill_the_gpu():
    for m, n, k in [(1, 4608, 4096), (1, 4096, 13696), (4, 4096, 4096), (8, 151552, 4096)]:
        cfg = gemv.select_config(m, n, k, torch.bfloat16)
        assert cfg.dot == (m > 1)
        assert triton.cdiv(n, cfg.block_n) * cfg.split_k >= 256


def test_tuned_table_is_well_formed():
    for (kind, m, n, k), cfg in gemv.TUNED.items():
        assert kind in ("linear", "gated") and m == gemv.rows_bucket(m) <= gemv.MAX_ROWS
        if cfg is None:     # cuBLAS measured faster there
            continue
        assert cfg.dot or m == 1
        assert all(v & (v - 1) == 0 for v in (cfg.block_n, cfg.block_k, cfg.num_warps))


def test_self_check_passes_and_disables_on_disagreement(monkeypatch):
    monkeypatch.setattr(gemv, "ENABLED", True)
    assert gemv.self_check(torch.device(DEVICE), torch.float32)
    monkeypatch.setattr(gemv, "reference", lambda *args, **kwargs: torch.ones(1, device=DEVICE))
    assert not gemv.self_check(torch.device(DEVICE), torch.float32)
    assert not gemv.ENABLED


@pytest.mark.skipif(DEVICE == "cuda", reason="checks the CPU path")
def test_cpu_layers_keep_the_pytorch_path():
    mlp = GatedMLP(64, 96, None, torch.float32)
    for p in mlp.parameters():
        p.data.normal_()
    x = torch.randn(1, 64)
    assert not uses_gemv(x, mlp.gate_up_proj.weight)
    assert UnquantizedLinearMethod().apply_gated_silu(mlp.gate_up_proj, x) is None
    assert torch.equal(mlp(x), mlp.down_proj(two_step(x, mlp.gate_up_proj.weight)))


# ---- CUDA: the real shapes, through the layers, inside a CUDA graph ---------------------------

GLM_SHAPES = {"qkv": (4608, 4096, True), "o_proj": (4096, 4096, False),
              "down": (4096, 13696, False), "lm_head": (151552, 4096, False)}


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("name", GLM_SHAPES)
def test_real_shapes_cuda(name, m):
    n, k, bias = GLM_SHAPES[name]
    x, w = rand(m, k, dtype=torch.bfloat16), rand(n, k, dtype=torch.bfloat16) * k ** -0.5
    b = rand(n, dtype=torch.bfloat16) if bias else None
    assert rel(gemv.gemv(x, w, b), F.linear(x, w, b)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_real_gate_up_cuda(m):
    x = rand(m, 4096, dtype=torch.bfloat16)
    w = rand(2 * 13696, 4096, dtype=torch.bfloat16) * 4096 ** -0.5
    assert rel(gemv.gated_gemv(x, w), two_step(x, w)) < 1e-2


@pytest.mark.gpu
def test_layers_use_the_gemv_cuda():
    mlp = GatedMLP(4096, 13696, None, torch.bfloat16).cuda()
    for p in mlp.parameters():
        p.data.normal_(std=0.02)
    x = rand(2, 4096, dtype=torch.bfloat16)
    assert uses_gemv(x, mlp.gate_up_proj.weight)
    ref = F.linear(two_step(x, mlp.gate_up_proj.weight), mlp.down_proj.weight)
    assert rel(mlp(x), ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("config", [Config(64, 256, split_k=4, dot=True),
                                    Config(16, 256, split_k=2)])
def test_split_k_in_a_cuda_graph(config):
    m = 4 if config.dot else 1
    x = rand(m, 4096, dtype=torch.bfloat16)
    w = rand(4096, 4096, dtype=torch.bfloat16) * 4096 ** -0.5
    expected = gemv.gemv(x, w, None, config)        # warm-up: compiles, allocates the workspace
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv.gemv(x, w, None, config)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    x.copy_(rand(m, 4096, dtype=torch.bfloat16))
    graph.replay()
    assert rel(out, F.linear(x, w)) < 1e-2


@pytest.mark.gpu
def test_pdl_chain_in_a_cuda_graph_sees_each_predecessors_writes():
    """On Hopper every kernel of this chain starts before its predecessor has drained (PDL) and
    must still read that predecessor's output, graph replay after replay."""
    from autoglm_serve.kernels import fused_ops, pdl
    device = torch.device("cuda")
    assert pdl.enabled(device) == (torch.cuda.get_device_capability() >= (9, 0))
    gate_up = rand(2 * 13696, 4096, dtype=torch.bfloat16) * 4096 ** -0.5
    down = rand(4096, 13696, dtype=torch.bfloat16) * 13696 ** -0.5
    qkv = rand(4608, 4096, dtype=torch.bfloat16) * 4096 ** -0.5
    norm_weight = torch.rand(4096, dtype=torch.bfloat16, device=DEVICE) + 0.5
    x = rand(1, 4096, dtype=torch.bfloat16)

    def chain():
        h = gemv.gemv(gemv.gated_gemv(x, gate_up), down)
        normed, _ = fused_ops.rms_norm(h, norm_weight, 1e-5, residual=x)
        return gemv.gemv(normed, qkv)

    def reference():
        h = F.linear(two_step(x, gate_up), down)
        s = (h.float() + x.float()).to(torch.bfloat16).float()
        normed = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
        return F.linear((norm_weight.float() * normed.float()).to(torch.bfloat16), qkv)

    chain()   # compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for _ in range(3):
        x.copy_(rand(1, 4096, dtype=torch.bfloat16))
        graph.replay()
        assert rel(out, reference()) < 2e-2


def test_self_check_skips_shapes_the_table_leaves_to_cublas(monkeypatch):
    """A None entry (cuBLAS won there) is no config to check; once it crashed the check, which
    then switched every GEMV off."""
    monkeypatch.setattr(gemv, "ENABLED", True)
    monkeypatch.setattr(gemv, "TUNED", {("linear", 16, 96, 64): None,
                                        ("linear", 2, 96, 64): Config(32, 64, dot=True)})
    assert gemv.self_check(torch.device(DEVICE), torch.bfloat16)
    assert not gemv.supports(torch.empty(16, 64, dtype=torch.bfloat16),
                             torch.empty(96, 64, dtype=torch.bfloat16))

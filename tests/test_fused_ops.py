"""Fused elementwise kernels against the PyTorch layers they replace: on CUDA compiled, on CPU
in the Triton interpreter (conftest sets TRITON_INTERPRET=1 where there is no GPU)."""
import pytest
import torch

triton = pytest.importorskip("triton")
from autoglm_serve.kernels import fused_ops  # noqa: E402
from autoglm_serve.kernels.vision_rotary import rotate_qk_  # noqa: E402
from autoglm_serve.models.glm4v_vision import _rotate_half  # noqa: E402
from autoglm_serve.models.layers.activation import SiluAndMul  # noqa: E402
from autoglm_serve.models.layers.norm import RMSNorm, rms_norm_pair  # noqa: E402
from autoglm_serve.models.layers.rotary import RotaryEmbedding  # noqa: E402
from autoglm_serve.quantization import fp8  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not triton.knobs.runtime.interpret:
    pytest.skip("no GPU and triton not in interpreter mode", allow_module_level=True)
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
pytestmark = pytest.mark.usefixtures("triton_interpreter_fixes")   # fp8 casts round there


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def tol(dtype):
    return 1e-5 if dtype == torch.float32 else 1e-2


@pytest.fixture(autouse=True)
def reference_path():
    """The modules' own forward must take the PyTorch path for the reference."""
    fused_ops.ENABLED = False
    yield
    fused_ops.ENABLED = True


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96, 4096])
def test_rms_norm(dtype, hidden):
    x = torch.randn(5, hidden, dtype=dtype, device=DEVICE)
    r = torch.randn_like(x)
    norm = RMSNorm(hidden, 1e-5, dtype).to(DEVICE)
    norm.weight.data.uniform_(0.5, 1.5)
    ref_out, ref_res = norm(x, r)
    out, res = fused_ops.rms_norm(x, norm.weight, 1e-5, r)
    assert rel(out, ref_out) < tol(dtype) and rel(res, ref_res) < tol(dtype)
    assert rel(fused_ops.rms_norm(x, norm.weight, 1e-5), norm(x)) < tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 64), (5, 96), (3, 4096)])
def test_rms_norm_pair(dtype, rows, hidden):
    # GLM-4: a sublayer output's own norm, the residual add and the next norm in one pass
    x = 3 * torch.randn(rows, hidden, dtype=dtype, device=DEVICE)
    r = torch.randn_like(x)
    first = RMSNorm(hidden, 1e-5, dtype).to(DEVICE)
    second = RMSNorm(hidden, 1e-6, dtype).to(DEVICE)
    first.weight.data.uniform_(0.5, 1.5)
    second.weight.data.uniform_(0.5, 1.5)
    ref_out, ref_sum, no_rows = rms_norm_pair(first, second, x, r, fp8=True)
    assert no_rows is None          # the PyTorch path leaves the quantization to the FP8 layer
    out, new_sum, fp8_rows = fused_ops.rms_norm_pair(x, r, first.weight, first.eps,
                                                     second.weight, second.eps, fp8=True)
    assert rel(out, ref_out) < tol(dtype) and rel(new_sum, ref_sum) < tol(dtype)
    # the next FP8 layer's input: the rows as stored, quantized per token as the torch ops do
    amax = fp8_rows.amax
    assert amax.dtype == torch.float32 and torch.equal(amax, out.float().abs().amax(dim=-1))
    if rows == 1:       # the FP8 GEMV's row: it quantizes the row itself, given the amax
        assert fp8_rows.codes is None and fp8_rows.scale is None
    else:
        codes, scale = fp8.quantize_rows(out)
        assert torch.equal(fp8_rows.scale, scale)
        assert torch.equal(fp8_rows.codes.view(torch.uint8), codes.view(torch.uint8))
    assert fused_ops.rms_norm_pair(x, r, first.weight, first.eps, second.weight,
                                   second.eps)[2] is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [16, 100, 1500])
def test_silu_and_mul(dtype, d):
    x = torch.randn(3, 2 * d, dtype=dtype, device=DEVICE)
    assert rel(fused_ops.silu_and_mul(x), SiluAndMul()(x)) < tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved,head_dim,rotary_dim", [(True, 128, 64), (False, 64, 64),
                                                             (True, 16, 8)])
def test_rotary_in_place_on_strided_views(dtype, interleaved, head_dim, rotary_dim):
    rot = RotaryEmbedding(head_dim, rotary_dim, 512, 10000.0, interleaved).to(DEVICE)
    pos = torch.randint(0, 512, (6,), device=DEVICE)
    heads, kv_heads = 4, 2
    qkv = torch.randn(6, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=DEVICE)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    ref_q, ref_k = rot(pos, q.clone(), k.clone())
    cos, sin = rot.cos_sin(pos)
    fused_ops.rotary_(q, cos, sin, head_dim, interleaved)
    fused_ops.rotary_(k, cos, sin, head_dim, interleaved)
    assert rel(q, ref_q) < tol(dtype) and rel(k, ref_k) < tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_self_check_passes_and_catches_a_wrong_kernel(monkeypatch, dtype):
    from autoglm_serve.engine.core.kernel_checks import check_fused_ops
    from autoglm_serve.kernels import kv_write
    device = torch.device(DEVICE)
    fused_ops.ENABLED = True
    assert check_fused_ops(device, dtype) and fused_ops.ENABLED
    # a rotary + KV write that forgets to rotate k: the fused kernels must turn themselves off
    monkeypatch.setattr(kv_write, "rotate_and_write_kv_cache",
                        lambda q, k, v, cache, slots, cos, sin, interleaved:
                        kv_write.write_kv_cache(k, v, cache, slots))
    assert not check_fused_ops(device, dtype)
    assert not fused_ops.ENABLED


# ---- the vision tower's rotary (and, on CUDA, the whole tower fused against unfused) ----

def vision_rotary_reference(qkv, cos, sin):
    q, k, v = qkv.unbind(1)
    c = torch.cat((cos, cos), dim=-1).unsqueeze(1)
    s = torch.cat((sin, sin), dim=-1).unsqueeze(1)
    rot = [(x.float() * c + _rotate_half(x.float()) * s).to(x.dtype) for x in (q, k)]
    return torch.stack(rot + [v], dim=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,head_dim", [(7, 3, 16), (33, 12, 128)])
def test_rotate_qk_matches_pytorch(dtype, tokens, heads, head_dim):
    qkv = torch.randn(tokens, 3, heads, head_dim, dtype=dtype, device=DEVICE)
    angles = torch.rand(tokens, head_dim // 2, device=DEVICE) * 50
    cos, sin = angles.cos(), angles.sin()
    want = vision_rotary_reference(qkv, cos, sin)
    v_before = qkv[:, 2].clone()
    got = rotate_qk_(qkv, cos, sin)
    assert got.data_ptr() == qkv.data_ptr(), "rotated in place"
    assert torch.equal(got[:, 2], v_before), "v untouched"
    assert rel(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tower_fused_equals_pytorch_path(dtype):
    """The whole tower at AutoGLM-Phone-9B's vision width, fused kernels on and off."""
    from types import SimpleNamespace
    from autoglm_serve.models.glm4v_vision import Glm4vVisionTower
    cfg = SimpleNamespace(hidden_size=1536, out_hidden_size=4096, intermediate_size=13696,
                          num_heads=12, depth=2, spatial_merge_size=2, in_channels=3,
                          temporal_patch_size=2, patch_size=14, image_size=336,
                          rms_norm_eps=1e-5, attention_bias=False)
    torch.manual_seed(0)
    tower = Glm4vVisionTower(cfg).to(device="cuda", dtype=dtype)
    for p in tower.parameters():
        p.data.normal_(0, 0.02)
    grid = [[1, 40, 36], [1, 12, 20]]
    pixels = torch.randn(sum(t * h * w for t, h, w in grid), 3 * 2 * 14 * 14, device="cuda")
    with torch.no_grad():
        fused_ops.ENABLED = True
        fused = tower(pixels, grid)
        fused_ops.ENABLED = False      # the reference_path fixture switches it back on
        plain = tower(pixels, grid)
    assert rel(fused, plain) < (1e-4 if dtype == torch.float32 else 2e-2)


def test_one_switch_picks_fused_or_pytorch():
    """kernels.fused_ops_for: the layers' one choice between the fused kernels and PyTorch."""
    from types import SimpleNamespace
    from autoglm_serve.kernels import fused_kernels_on, fused_ops_for
    on_cuda, on_cpu = SimpleNamespace(is_cuda=True), torch.zeros(1)
    fused_ops.ENABLED = True
    assert fused_ops_for(on_cuda) is fused_ops and fused_kernels_on(on_cuda)
    assert fused_ops_for(on_cpu) is None and not fused_kernels_on(on_cpu)
    fused_ops.ENABLED = False          # the self-check failed: PyTorch everywhere
    assert fused_ops_for(on_cuda) is None and not fused_kernels_on(on_cuda)


def test_launch_sizes_round_up_to_powers_of_two_as_triton_does():
    import triton

    from autoglm_serve.kernels import next_power_of_2
    assert [next_power_of_2(n) for n in range(1, 20000)] == [
        triton.next_power_of_2(n) for n in range(1, 20000)]

"""The vision tower's fused rotary (and its fused norms, on CUDA) against its PyTorch path:
on CUDA compiled, on CPU in the Triton interpreter (conftest sets TRITON_INTERPRET=1)."""
import pytest
import torch

triton = pytest.importorskip("triton")
from autoglm_serve.kernels import fused_ops  # noqa: E402
from autoglm_serve.kernels.vision_rotary import rotate_qk_  # noqa: E402
from autoglm_serve.models.glm4v_vision import _rotate_half  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not triton.knobs.runtime.interpret:
    pytest.skip("no GPU and triton not in interpreter mode", allow_module_level=True)
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def reference(qkv, cos, sin):
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
    want = reference(qkv, cos, sin)
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
        fused = tower(pixels, grid)
        fused_ops.ENABLED = False
        try:
            plain = tower(pixels, grid)
        finally:
            fused_ops.ENABLED = True
    assert rel(fused, plain) < (1e-4 if dtype == torch.float32 else 2e-2)

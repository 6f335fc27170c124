"""--kv-cache-dtype fp8: the KV cache is stored in float8 e4m3 (scale 1.0), a quarter of the
CPU's float32 bytes per block, and attention reads it back: logits stay close to the 16/32-bit
cache's, and are not identical to them (the cache really is fp8)."""
import pytest
import torch

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.config import EngineConfig
from tests.tiny_models import build_tiny_decoder

PROMPTS = [[5, 17, 33, 2, 9, 41, 7], list(range(10, 40))]


def logits_of(llm):
    seen = {}
    llm.engine.core.runner.logits_hook = lambda reqs, logits: [
        seen.setdefault(r.request_id, []).append(logits[i].clone()) for i, r in enumerate(reqs)]
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    return [torch.stack(seen[o.request_id]) for o in outs]


@pytest.mark.parametrize("arch", ["llama", "glm4"])
def test_fp8_kv_cache_is_fp8_and_close(tmp_path, arch):
    path, _ = build_tiny_decoder(tmp_path / arch, arch)
    kw = dict(skip_tokenizer_init=True, block_size=8, dtype="float32", num_kv_blocks=32,
              max_num_batched_tokens=16)
    full, fp8 = LLM(str(path), **kw), LLM(str(path), kv_cache_dtype="fp8", **kw)
    runner = fp8.engine.core.runner
    assert all(c.dtype == torch.float8_e4m3fn for c in runner.kv_caches)
    assert runner.kv_bytes_per_block() * 4 == full.engine.core.runner.kv_bytes_per_block()
    # the first step's logits (same prompt, same cache contents up to rounding)
    for a, b in zip(logits_of(fp8), logits_of(full)):
        rel = ((a[0] - b[0]).norm() / b[0].norm()).item()
        assert 1e-5 < rel < 0.1, rel


def test_kv_cache_dtype_is_validated():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="int4")


@pytest.mark.parametrize("block_size", [16, 64])
def test_triton_kernels_read_an_fp8_cache(monkeypatch, block_size):
    """Decode and prefill kernels (Triton interpreter on CPU, compiled on CUDA) on an fp8 cache
    against the PyTorch backend on the same cache (pages of 64: the prefill's TMA boxes)."""
    triton = pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not triton.knobs.runtime.interpret:
        pytest.skip("no GPU and triton not in interpreter mode")
    from autoglm_serve.models.layers.torch_attention import TorchAttentionBackend
    from autoglm_serve.models.layers.triton_attention import TritonAttentionBackend
    from tests.paged_attention_cases import make_batch
    from tests.triton_interpreter_fixes import fix_interpreter
    if device == "cpu":
        fix_interpreter(monkeypatch)
    b = make_batch([1, 37, 300], [(20, 9), (0, 17)], num_heads=8, num_kv_heads=2, head_dim=32,
                   block_size=block_size, dtype=torch.bfloat16, device=device)
    cache = b.kv_cache.nan_to_num(0.0).to(torch.float8_e4m3fn)
    ref_cache = cache.clone()
    out = TritonAttentionBackend().forward(b.q, b.k, b.v, cache, b.meta, b.scale)
    ref = TorchAttentionBackend().forward(b.q, b.k, b.v, ref_cache, b.meta, b.scale)
    rows = b.valid_rows
    assert torch.equal(cache.view(torch.uint8), ref_cache.view(torch.uint8))
    assert ((out[rows].float() - ref[rows].float()).norm() / ref[rows].float().norm()) < 2e-2

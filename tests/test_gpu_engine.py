"""The GPU fast path (Triton attention + decode CUDA graphs) against the PyTorch reference
backend on the same weights, for a mixed batch. Runs only where CUDA is present."""
import pytest
import torch

from autoglm_serve import LLM, SamplingParams
from tests.tiny_models import build_tiny_decoder

pytestmark = pytest.mark.gpu

PROMPTS = [[3 + i % 200 for i in range(n)] for n in (1, 7, 40, 130, 300)] + [[9, 8, 7] * 50]
STEPS = 16


def run(path, backend, eager, hook_store):
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="bfloat16", attention_backend=backend,
              enforce_eager=eager, block_size=16, max_num_batched_tokens=128,
              kv_cache_memory_gib=1, max_num_seqs=32)
    llm.engine.core.runner.logits_hook = lambda reqs, logits: [
        hook_store.setdefault(r.request_id, []).append(logits[i].float().cpu())
        for i, r in enumerate(reqs)]
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))
    return llm, [o.outputs[0].token_ids for o in outs], [o.request_id for o in outs]


@pytest.mark.parametrize("arch", ["llama", "glm4"])
def test_fast_path_matches_reference(tmp_path, arch):
    path, _ = build_tiny_decoder(tmp_path / arch, arch, vocab_size=256)
    ref_logits, fast_logits = {}, {}
    _, ref_tokens, ref_ids = run(path, "torch", True, ref_logits)
    llm, fast_tokens, fast_ids = run(path, "triton", False, fast_logits)
    assert llm.engine.core.runner.graphs is not None   # decode steps replayed graphs
    for rid_ref, rid_fast, a, b in zip(ref_ids, fast_ids, ref_tokens, fast_tokens):
        assert a[:4] == b[:4]
        # compare logits while both paths agree on the tokens (same inputs)
        agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        for x, y in zip(ref_logits[rid_ref][:agree + 1], fast_logits[rid_fast][:agree + 1]):
            rel = ((x - y).norm() / x.norm()).item()
            assert rel < 2e-2, rel

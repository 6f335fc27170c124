"""Our engine against transformers on the same weights: logits at every step, greedy tokens."""
import pytest
import torch

from autoglm_serve import LLM, SamplingParams
from tests.tiny_models import build_tiny_decoder

PROMPTS = [[5, 17, 33, 2, 9, 41, 7], [3] * 5 + [60, 61, 62], list(range(10, 50)), [77]]
STEPS = 24


def hf_greedy_with_logits(model, prompt, steps):
    ids = torch.tensor([prompt])
    logits_per_step = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(ids).logits[0, -1]
            logits_per_step.append(logits)
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist(), logits_per_step


@pytest.mark.parametrize("arch", ["llama", "glm4"])
@pytest.mark.parametrize("chunked", [True, False])
def test_tiny_model_matches_transformers(tmp_path, arch, chunked):
    path, hf = build_tiny_decoder(tmp_path / arch, arch)
    llm = LLM(str(path), skip_tokenizer_init=True, block_size=8, dtype="float32",
              max_num_batched_tokens=16 if chunked else 512, enable_chunked_prefill=chunked,
              num_kv_blocks=64)
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.core.runner.logits_hook = lambda reqs, logits: [
        seen.setdefault(r.request_id, []).append(logits[i].clone()) for i, r in enumerate(reqs)]
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    for out, prompt in zip(outs, PROMPTS):
        tokens, ref_logits = hf_greedy_with_logits(hf, prompt, STEPS)
        assert out.outputs[0].token_ids == tokens
        ours = seen[out.request_id]
        assert len(ours) == STEPS
        for step, (a, b) in enumerate(zip(ours, ref_logits)):
            rel = ((a - b).norm() / b.norm()).item()
            assert rel < 1e-4, f"{arch} prompt {prompt[:3]} step {step}: rel err {rel:.2e}"

"""A prompt gives the same tokens alone and inside a crowded batch.

The batch runs with chunked prefill under a 64-token budget (long prompts are split across
steps, mixed with other requests' decodes) and a KV cache too small for all requests at once
(requests are preempted and recomputed). Greedy and seeded sampling must not notice.
In float32: the bf16 default changes kernels with the batch's row count (4-bit for a few rows,
dense for more), so its rounding, not its scheduling, would differ.
"""
import pytest

from autoglm_serve import SamplingParams
from tests.engine_helpers import sibling_llm

QUESTIONS = [
    "Hi",
    "What is 2 + 2?",
    "Name a color.",
    "Write one sentence about cats.",
    "Explain in detail how a refrigerator keeps food cold, covering the compressor, the "
    "refrigerant, the condenser coils and the evaporator, and why the back of it gets warm.",
    "Translate 'thank you very much' into French.",
    "List the planets of the solar system in order from the sun.",
    "Tell me a very short joke.",
    "You are a phone assistant. The user wants to open the settings app, go to Wi-Fi, turn it "
    "on, and connect to the network called HomeNetwork with the password written on the "
    "router. Describe each tap you would make on a typical Android phone, step by step.",
    "Why is the sky blue?",
    "What does CPU stand for?",
    "Summarize the plot of Romeo and Juliet in two sentences, mentioning the families, the "
    "secret marriage, the banishment, and the tragic ending in the tomb.",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "Suggest a name for a small bakery that sells bread and cakes in a quiet seaside town.",
    "What is the boiling point of water at sea level in Celsius and in Fahrenheit?",
]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def prompts(default_llm_float32):
    tok = default_llm_float32.tokenizer
    chats = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                     add_generation_prompt=True) for q in QUESTIONS]
    ids = [tok.encode(c, add_special_tokens=False) for c in chats]
    assert max(map(len, ids)) > 64 > min(map(len, ids))   # some prompts need several chunks
    return ids


@pytest.fixture(scope="module")
def crowded(default_llm_float32):
    # 32 blocks of 16 tokens: far fewer than the 16 requests need together (~5 blocks each)
    return sibling_llm(default_llm_float32, max_model_len=256, max_num_batched_tokens=64,
                       enable_chunked_prefill=True, num_kv_blocks=32)


def _check_crowded_run(llm, outs):
    core = llm.engine.core
    assert any(o.num_preemptions > 0 for o in outs)
    assert core.kv.num_free_blocks == core.kv.num_blocks   # everything released at the end
    return [i for i, o in enumerate(outs) if o.num_preemptions > 0]


def test_greedy_alone_equals_in_crowded_batch(default_llm_float32, crowded, prompts):
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    before = crowded.engine.core.scheduler.num_preemptions
    batch = crowded.generate(prompts, params)
    assert crowded.engine.core.scheduler.num_preemptions > before
    preempted = _check_crowded_run(crowded, batch)
    # Alone on the default engine: whole-prompt prefill, no preemption. Checked for the first
    # and last arrivals and for requests that were preempted (running each alone is slow here).
    for i in sorted({0, len(prompts) - 1, *preempted[:2]}):
        alone = default_llm_float32.generate([prompts[i]], params)[0]
        assert alone.num_preemptions == 0
        assert batch[i].outputs[0].token_ids == alone.outputs[0].token_ids, f"prompt {i}"
        assert len(alone.outputs[0].token_ids) == NEW_TOKENS


def test_seeded_sampling_alone_equals_in_crowded_batch(default_llm_float32, crowded, prompts):
    params = [SamplingParams(temperature=0.8, seed=1000 + i, max_tokens=NEW_TOKENS,
                             ignore_eos=True) for i in range(len(prompts))]
    batch = crowded.generate(prompts, params)
    preempted = _check_crowded_run(crowded, batch)
    for i in sorted({0, *preempted[:2]}):
        alone = default_llm_float32.generate([prompts[i]], params[i])[0]
        assert batch[i].outputs[0].token_ids == alone.outputs[0].token_ids, f"prompt {i}"
    # the seed matters: another seed gives other tokens for some prompt
    other = default_llm_float32.generate(prompts[:2], [SamplingParams(temperature=0.8, seed=7 + i,
                                 max_tokens=NEW_TOKENS, ignore_eos=True) for i in range(2)])
    assert any(o.outputs[0].token_ids != b.outputs[0].token_ids
               for o, b in zip(other, batch[:2]))

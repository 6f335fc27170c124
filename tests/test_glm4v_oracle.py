"""Our GLM-4.1V against transformers' Glm4vForConditionalGeneration on the same tiny weights:
logits at every step (text only, one image, two images of different sizes), greedy tokens alone
and batched."""
import numpy as np
import pytest
import torch
from PIL import Image

from autoglm_serve.engine.core.warm_up import warm_up
from autoglm_serve import LLM, SamplingParams
from tests.glm4v_fixtures import make_tiny_glm4v

STEPS = 32


def random_image(w, h, seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_glm4v(tmp_path_factory.mktemp("glm4v"))


@pytest.fixture(scope="module")
def hf(checkpoint):
    from transformers import AutoTokenizer, Glm4vForConditionalGeneration, Glm4vImageProcessorPil
    model = Glm4vForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return (model, AutoTokenizer.from_pretrained(checkpoint),
            Glm4vImageProcessorPil.from_pretrained(checkpoint))


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(str(checkpoint), dtype="float32", block_size=16, max_model_len=2048,
               max_num_batched_tokens=64)


def build_prompt(tokenizer, texts_and_images):
    """Token ids with one <|begin_of_image|><|image|><|end_of_image|> per image."""
    ids = tokenizer.encode("[gMASK]<sop><|user|>\n", add_special_tokens=False)
    for part in texts_and_images:
        if isinstance(part, str):
            ids += tokenizer.encode(part, add_special_tokens=False)
        else:
            ids += tokenizer.convert_tokens_to_ids(
                ["<|begin_of_image|>", "<|image|>", "<|end_of_image|>"])
    return ids + tokenizer.encode("<|assistant|>\n", add_special_tokens=False)


def hf_reference(model, processor, ids, images, steps):
    """transformers' own preprocessing, placeholder expansion and forward, one step at a time."""
    image_token = model.config.image_token_id
    kwargs = {}
    if images:
        proc = processor(images=images, return_tensors="pt")
        kwargs = dict(pixel_values=proc["pixel_values"], image_grid_thw=proc["image_grid_thw"])
        expanded, k = [], 0
        for t in ids:
            if t == image_token:
                t_, h, w = proc["image_grid_thw"][k].tolist()
                expanded += [image_token] * (t_ * h * w // 4)
                k += 1
            else:
                expanded.append(t)
        ids = expanded
    seq = torch.tensor([ids])
    logits_steps, tokens = [], []
    with torch.no_grad():
        for _ in range(steps):
            if images:  # which tokens are image tokens, as transformers' processor returns it
                kwargs["mm_token_type_ids"] = (seq == image_token).long()
            logits = model(input_ids=seq, **kwargs).logits[0, -1]
            logits_steps.append(logits)
            nxt = int(logits.argmax())
            tokens.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    return tokens, logits_steps


CASES = {
    "text": ["tap the settings icon"],
    "one_image": [random_image(84, 140, 1), "where is the back button?"],
    "two_images": [random_image(56, 112, 2), "then", random_image(140, 84, 3), "compare them"],
}


def assert_matches_transformers(llm, hf, parts: list, steps: int, label: str) -> None:
    """Greedy tokens equal to transformers' and every step's logits within 1e-4 (relative) for
    a prompt of text parts and images."""
    model, tokenizer, processor = hf
    images = [p for p in parts if not isinstance(p, str)]
    ids = build_prompt(tokenizer, parts)
    ref_tokens, ref_logits = hf_reference(model, processor, ids, images, steps)

    seen = []
    llm.engine.core.runner.logits_hook = lambda reqs, logits: seen.append(logits[0].clone())
    try:
        out = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": images}},
                           SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))[0]
    finally:
        llm.engine.core.runner.logits_hook = None
    assert out.outputs[0].token_ids == ref_tokens
    for step, (a, b) in enumerate(zip(seen, ref_logits, strict=True)):
        rel = ((a - b).norm() / b.norm()).item()
        assert rel < 1e-4, f"{label} step {step}: relative error {rel:.2e}"


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_every_step(llm, hf, case):
    assert_matches_transformers(llm, hf, CASES[case], STEPS, case)


def test_greedy_same_alone_and_batched(llm, hf):
    _, tokenizer, _ = hf
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    prompts = [{"prompt_token_ids": build_prompt(tokenizer, parts),
                "multi_modal_data": {"image": [p for p in parts if not isinstance(p, str)]}}
               for parts in CASES.values()]
    prompts.append(build_prompt(tokenizer, ["a longer text only request " * 8]))
    alone = [llm.generate(p, params)[0].outputs[0].token_ids for p in prompts]
    llm.engine.core.kv.reset_prefix_cache()
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert alone == together


def test_greedy_same_with_prompts_in_tiny_chunks(llm, hf):
    """Budgets of 2 and 4 tokens: prompts (the image's included) arrive a few tokens at a time
    beside the other request's decodes, so the runner lays out single prompt tokens as decode
    rows (M-RoPE positions from the image's) and reorders batches where a decode follows a
    chunk."""
    _, tokenizer, _ = hf
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [build_prompt(tokenizer, CASES["text"]),
               {"prompt_token_ids": build_prompt(tokenizer, CASES["one_image"]),
                "multi_modal_data": {"image": [CASES["one_image"][0]]}}]
    llm.engine.core.kv.reset_prefix_cache()
    expected = [llm.generate(p, params)[0].outputs[0].token_ids for p in prompts]
    for budget in (2, 4):
        tiny = LLM(loaded=llm.engine.core.loaded, dtype="float32", block_size=16,
                   max_model_len=2048, max_num_batched_tokens=budget)
        assert [o.outputs[0].token_ids for o in tiny.generate(prompts, params)] == expected


def test_warm_up_encodes_a_screenshot_and_leaves_no_trace(checkpoint, llm, hf):
    """The start-up warm-up (run on CUDA) puts a phone screenshot, sized by the server's image
    settings, through the vision tower; afterwards no cache holds anything of it and answers
    are unchanged."""
    _, tokenizer, _ = hf
    warm = LLM(str(checkpoint), loaded=llm.engine.core.loaded, dtype="float32", block_size=16,
               max_model_len=2048, max_num_batched_tokens=64,
               mm_processor_kwargs={"max_pixels": 200_000})
    core = warm.engine.core
    grids = []
    begin_images = core.runner.model.begin_images

    def recording(pixel_values, grid_thw):
        grids.extend(tuple(g) for g in grid_thw)
        return begin_images(pixel_values, grid_thw)

    core.runner.model.begin_images = recording
    parts = CASES["one_image"]
    prompt = {"prompt_token_ids": build_prompt(tokenizer, parts),
              "multi_modal_data": {"image": [parts[0]]}}
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before = warm.generate(prompt, params)[0].outputs[0].token_ids
    core.kv.reset_prefix_cache()
    core.runner.encoder_cache.clear()
    grids.clear()

    warm_up(core)
    assert any(h > 2 * w for _, h, w in grids), grids   # the tall screenshot went through
    cache = core.runner.encoder_cache
    assert not cache.entries and cache.hits == cache.misses == 0
    assert core.kv.prefix_queries == core.kv.prefix_hits == 0 and not core.has_unfinished()
    assert warm.generate(prompt, params)[0].outputs[0].token_ids == before

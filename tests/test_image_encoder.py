"""The vision tower spread over steps (engine/core/image_encoder.py): the same embeddings as
one forward, running decodes advance every step while a screenshot is encoded, each step's
vision work stays within what the decodes leave of the budget, and the answers equal those of
an engine that encodes whole images."""
import math

import numpy as np
import pytest
import torch
from PIL import Image

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.engine.frontend.input_processor import PreparedPrompt
from tests.glm4v_fixtures import make_tiny_glm4v
from tests.test_glm4v_oracle import build_prompt


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_glm4v(tmp_path_factory.mktemp("glm4v"))


def image(seed, w=112, h=252):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


def test_blocks_in_steps_equal_one_forward(checkpoint):
    llm = LLM(str(checkpoint), dtype="float32", max_model_len=2048, num_kv_blocks=256)
    model = llm.engine.core.runner.model
    torch.manual_seed(0)
    grid = [(1, 8, 6), (1, 4, 4)]
    pixels = torch.randn(sum(t * h * w for t, h, w in grid), model.visual.patch_dim)
    with torch.inference_mode():
        whole = model.embed_images(pixels, grid)
        encoding = model.begin_images(pixels, grid)
        while encoding.blocks_left:
            with pytest.raises(RuntimeError):
                encoding.result()
            encoding.advance(1)
        assert torch.equal(encoding.result(), whole)


def test_the_merger_is_priced_into_the_step_that_runs_the_last_block(checkpoint):
    """The downsample and patch merger run with the last block; a budget that pays for the
    last blocks but not for them leaves the last block to the next step."""
    from transformers import AutoTokenizer
    from autoglm_serve.engine.core.image_encoder import ImageEncoder
    from autoglm_serve.multimodal.encoder_cache import EncoderCache
    llm = LLM(str(checkpoint), dtype="float32", max_model_len=2048, num_kv_blocks=256)
    model = llm.engine.core.runner.model
    item = _agent_prompt(llm, AutoTokenizer.from_pretrained(checkpoint), 4).mm_items[0]
    patches = item.grid_thw[0] * item.grid_thw[1] * item.grid_thw[2]
    token = model.flops_per_text_token()
    block = model.visual.block_flops([patches]) / token
    finish = model.visual.finish_flops(patches) / token
    depth = len(model.visual.blocks)
    assert depth == 2 and 0.2 * block < finish < 2 * block

    encoder = ImageEncoder(model, EncoderCache(), torch.device("cpu"))
    assert encoder.encode(item, 2 * block + finish - 0.01) == math.ceil(block)
    assert encoder.in_progress == item.content_hash
    assert encoder.encode(item, 2 * block + finish - 0.01) == math.ceil(block + finish)
    assert encoder.ready(item) and encoder.in_progress is None

    whole = ImageEncoder(model, EncoderCache(), torch.device("cpu"))
    assert whole.encode(item, 2 * block + finish) == math.ceil(2 * block + finish)
    assert whole.ready(item) and whole.blocks_run == depth
    assert torch.equal(whole.cache.entries[item.content_hash],
                       encoder.cache.entries[item.content_hash])


def _agent_prompt(llm, tokenizer, seed):
    ids = build_prompt(tokenizer, [f"step {seed}: what next?", image(seed)])
    return llm.engine.frontend.prepare(ids, [image(seed)])


def test_decodes_advance_every_step_while_a_screenshot_encodes(checkpoint):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    # a budget of 16 tokens, 4 of them taken by decodes: less than one block of this tiny
    # tower over a 144-patch image (~12.5 token-equivalents), so one block a step
    llm = LLM(str(checkpoint), dtype="float32", block_size=16, max_model_len=2048,
              max_num_batched_tokens=16, max_num_seqs=8, num_kv_blocks=256)
    core, eng = llm.engine.core, llm.engine
    images = core.runner.images
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(4):      # text-only requests, decoding by the time the image arrives
        eng.add_request(f"text{i}", PreparedPrompt([5 + i, 9, 2, 77]), params)
    for _ in range(4):
        eng.step()
    assert core.scheduler.tokens_owed_by_running() == 4      # four decodes
    eng.add_request("agent", _agent_prompt(llm, tokenizer, 1), SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True, frequency_penalty=0.2, top_p=0.85))
    depth = len(core.runner.model.visual.blocks)
    tokens_per_step, blocks_per_step = [], []
    agent_tokens = []
    while eng.has_unfinished():
        before = images.blocks_run
        outs = eng.step()
        blocks_per_step.append(images.blocks_run - before)
        tokens_per_step.append(sum(len(o.outputs[0].token_ids) > 0 for o in outs
                                   if o.request_id.startswith("text")))
        agent_tokens += [o for o in outs if o.request_id == "agent"]
        if blocks_per_step[-1] and core.scheduler.running:
            # while decodes run, a step's blocks cost at most what they leave of the budget
            cost = core.runner.model.visual.block_flops([144]) / images.token_flops
            assert blocks_per_step[-1] == 1 or blocks_per_step[-1] * cost <= 16 - 4
    encoding_steps = [i for i, b in enumerate(blocks_per_step) if b]
    assert sum(blocks_per_step) == depth           # encoded once, over several steps
    assert len(encoding_steps) > 1
    # every text request got a token in every step that encoded (no step waited for the tower)
    for i in encoding_steps:
        if i + 1 < len(tokens_per_step):
            assert tokens_per_step[i + 1] == 4 or tokens_per_step[i] == 4
    whole = LLM(str(checkpoint), loaded=core.loaded, dtype="float32", block_size=16,
                max_model_len=2048, max_num_batched_tokens=4096, num_kv_blocks=256)
    ids = build_prompt(tokenizer, ["step 1: what next?", image(1)])
    ref = whole.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": [image(1)]}},
                         SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True, frequency_penalty=0.2, top_p=0.85))
    assert agent_tokens[-1].outputs[0].token_ids == ref[0].outputs[0].token_ids
    assert core.kv.num_free_blocks == core.kv.num_blocks
    cache = core.runner.encoder_cache
    assert cache.misses == 1      # encoded ahead: the miss it was (later chunks' reads hit)


def test_many_waiting_screenshots_are_each_encoded_once(checkpoint):
    """Many agents' screenshots waiting at once (the 64-agent load) with an encoder cache of
    two images: the encoder works for the first held prompt only, so no image is evicted
    before its prefill reads it, and every prompt completes."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    llm = LLM(str(checkpoint), dtype="float32", block_size=16, max_model_len=2048,
              max_num_batched_tokens=64, max_num_seqs=8, num_kv_blocks=256)
    core = llm.engine.core
    core.runner.encoder_cache.max_tokens = 72          # two 36-token images
    prompts = [{"prompt_token_ids": build_prompt(tokenizer, [f"agent {i}", image(10 + i)]),
                "multi_modal_data": {"image": [image(10 + i)]}} for i in range(6)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [4] * 6
    assert core.runner.images.blocks_run == 6 * len(core.runner.model.visual.blocks)
    assert core.runner.encoder_cache.misses == 6


def test_an_aborted_prompts_part_run_image_is_freed_unless_another_needs_it(checkpoint):
    """Aborting the request whose screenshot is half encoded frees the encoding's states at
    once (they stayed until another image began, on an idle server for good); a request
    still waiting for the same image keeps it, and it is encoded once for that request."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    llm = LLM(str(checkpoint), dtype="float32", block_size=16, max_model_len=2048,
              max_num_batched_tokens=16, max_num_seqs=8, num_kv_blocks=256)
    core, eng = llm.engine.core, llm.engine
    images = core.runner.images
    depth = len(core.runner.model.visual.blocks)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    def step_until_part_run():
        before = images.blocks_run
        while images.in_progress is None:
            eng.step()
        assert 0 < images.blocks_run - before < depth

    eng.add_request("alone", _agent_prompt(llm, tokenizer, 2), params)
    step_until_part_run()
    eng.abort("alone")
    assert images.in_progress is None
    while eng.has_unfinished():
        eng.step()
    assert core.kv.num_free_blocks == core.kv.num_blocks

    run_before = images.blocks_run
    eng.add_request("first", _agent_prompt(llm, tokenizer, 3), params)
    eng.add_request("twin", _agent_prompt(llm, tokenizer, 3), params)
    step_until_part_run()
    eng.abort("first")
    assert images.in_progress is not None        # "twin" needs the same screenshot
    outs = []
    while eng.has_unfinished():
        outs += [o for o in eng.step() if o.request_id == "twin" and o.finished]
    assert len(outs) == 1 and len(outs[0].outputs[0].token_ids) == 4
    assert images.blocks_run - run_before == depth      # not restarted: encoded once
    assert core.kv.num_free_blocks == core.kv.num_blocks

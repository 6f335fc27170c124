"""The start-up profile's worst step (engine/core/memory_plan.py). Its memory is measured on a GPU
only (the sizing there is checked by the GPU run in BENCHMARKS.md); here: that the worst step
is the one the settings allow and that it runs through the real model and sampler."""
from __future__ import annotations

import pytest
import torch

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.engine.core.memory_plan import largest_image
from autoglm_serve.engine.core.worst_step import profile_worst_step
from tests.glm4v_fixtures import make_tiny_glm4v

MAX_PIXELS = 120_000


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    torch.set_num_threads(2)
    path = make_tiny_glm4v(tmp_path_factory.mktemp("tiny-glm4v"))
    return LLM(str(path), dtype="float32", max_model_len=2048, max_num_seqs=8,
               max_num_batched_tokens=512, mm_processor_kwargs={"max_pixels": MAX_PIXELS})


def test_the_largest_image_is_the_most_the_image_settings_allow(llm):
    core = llm.engine.core
    item = largest_image(core.config, core.loaded)
    t, h, w = item.grid_thw
    pixels = 2 * h * w * 14 * 14        # both frames of a still image, as smart_resize counts
    assert pixels <= MAX_PIXELS
    assert pixels > 0.9 * MAX_PIXELS            # within a rounding of the limit
    assert item.patches(core.device).shape[0] == t * h * w


def test_the_worst_step_runs_and_leaves_the_engine_as_it_was(llm):
    core = llm.engine.core
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    before = llm.generate([[1, 2, 3, 4, 5]], params)[0].outputs[0].token_ids
    # every part, the prompt steps' piecewise graphs' buffers and eager forward included
    profile_worst_step(core.runner, largest_image(core.config, core.loaded), prompt_graphs=True)
    assert llm.generate([[1, 2, 3, 4, 5]], params)[0].outputs[0].token_ids == before
    assert core.kv.num_free_blocks == core.kv.num_blocks


def test_a_configuration_that_cannot_fit_says_what_would(tmp_path):
    from tests.tiny_models import build_tiny_decoder
    path, _ = build_tiny_decoder(tmp_path / "llama", "llama")
    with pytest.raises(ValueError, match=r"fewer than max_model_len=64: lower --max-model-len"):
        LLM(str(path), skip_tokenizer_init=True, dtype="float32", max_model_len=64,
            kv_cache_memory_gib=1e-6)

"""The bundled AutoGLM-Phone-9B files: the config loads in transformers and carries the
architecture's numbers; the generation config, tokenizer stand-in and chat template match
GLM-4.1V-9B-Thinking's published ones."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

CONFIG_DIR = Path(__file__).parents[1] / "autoglm_serve/models/configs/autoglm-phone-9b"


@pytest.fixture(scope="module")
def config():
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(CONFIG_DIR)


def test_loads_as_glm4v(config):
    assert type(config).__name__ == "Glm4vConfig"
    assert json.loads((CONFIG_DIR / "config.json").read_text())["architectures"] == ["Glm4vForConditionalGeneration"]


def test_text_numbers(config):
    t = config.text_config
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads) == (4096, 40, 32, 2)
    assert t.head_dim == 128 == t.hidden_size // t.num_attention_heads
    assert (t.intermediate_size, t.vocab_size, t.max_position_embeddings) == (13696, 151552, 65536)
    assert t.attention_bias is True
    assert t.rms_norm_eps == 1e-5
    rope = t.rope_parameters
    assert rope["partial_rotary_factor"] == 0.5
    assert rope["rope_theta"] == 10000.0
    assert rope["mrope_section"] == [8, 12, 12]
    assert sum(rope["mrope_section"]) * 2 == int(t.head_dim * rope["partial_rotary_factor"])


def test_vision_numbers(config):
    v = config.vision_config
    assert (v.depth, v.hidden_size, v.num_heads) == (24, 1536, 12)
    assert (v.patch_size, v.temporal_patch_size, v.spatial_merge_size) == (14, 2, 2)
    assert (v.out_hidden_size, v.intermediate_size, v.image_size) == (4096, 13696, 336)
    assert v.out_hidden_size == config.text_config.hidden_size


def test_token_ids(config):
    assert (config.image_token_id, config.image_start_token_id, config.image_end_token_id) == (151343, 151339, 151340)
    assert (config.video_token_id, config.video_start_token_id, config.video_end_token_id) == (151344, 151341, 151342)
    assert list(config.text_config.eos_token_id) == [151329, 151336, 151338]
    assert config.text_config.pad_token_id == 151329
    gen = json.loads((CONFIG_DIR / "generation_config.json").read_text())
    assert gen["pad_token_id"] == 151329


def test_matches_transformers_defaults_where_they_agree(config):
    """transformers' Glm4vConfig defaults mirror GLM-4.1V-9B; ours differ only where the checkpoint does."""
    from transformers import Glm4vConfig

    default = Glm4vConfig()
    ours_v, def_v = config.vision_config.to_dict(), default.vision_config.to_dict()
    for key, value in def_v.items():
        if key in ("transformers_version", "dtype"):
            continue
        assert ours_v.get(key) == value, key
    ours_t, def_t = config.text_config.to_dict(), default.text_config.to_dict()
    # known differences: the checkpoint's longer context, its pad id, partial rotary + M-RoPE sections
    expected_diff = {"max_position_embeddings", "pad_token_id", "rope_parameters"}
    for key, value in def_t.items():
        if key in expected_diff or key in ("transformers_version", "dtype"):
            continue
        assert ours_t.get(key) == value, key
    for key in ("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
                "video_start_token_id", "video_end_token_id", "tie_word_embeddings"):
        assert getattr(config, key) == getattr(default, key), key


def test_preprocessor_config_loads():
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(CONFIG_DIR)
    assert proc.size.shortest_edge == 12544 and proc.size.longest_edge == 9633792
    assert (proc.patch_size, proc.temporal_patch_size, proc.merge_size) == (14, 2, 2)


@pytest.fixture(scope="module")
def tokenizer():
    from autoglm_serve.models.configs.glm_tokenizer import byte_level_glm_tokenizer

    return byte_level_glm_tokenizer()


def render(tokenizer, messages, **kwargs):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **kwargs)


def test_generation_config_as_published(config, tokenizer):
    """EOS ids [151329, 151336, 151338, 151348] (</answer> ends a reply), do_sample true; do_sample
    is no sampling default (as in vLLM, only temperature/top_p/... are)."""
    from autoglm_serve.engine.frontend.frontend import eos_ids
    from autoglm_serve.engine.core.model_setup import generation_defaults

    gen = json.loads((CONFIG_DIR / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151329, 151336, 151338, 151348]
    assert gen["do_sample"] is True
    assert generation_defaults(gen) == {}
    assert eos_ids(tokenizer, config, gen) == {151329, 151336, 151338, 151348}
    assert tokenizer.convert_ids_to_tokens(151348) == "</answer>"


def test_token_ids_as_in_transformers_integration_test(tokenizer):
    """transformers' GLM-4.1V test: a user turn opening with an image starts
    [gMASK] <sop> <|user|> \\n <|begin_of_image|> <|image|>."""
    prompt = render(tokenizer, [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "What kind of dog is this?"}]}])
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids[:6] == [151331, 151333, 151336, 198, 151339, 151343]


def test_reasoning_tags_are_ordinary_tokens(tokenizer):
    """<think> </think> <answer> </answer>: one token each, kept by skip_special_tokens (the
    role tokens are dropped)."""
    ids = tokenizer("<think>a</think><answer>b</answer><|user|>", add_special_tokens=False)[
        "input_ids"]
    assert len(ids) == 7 and ids[1] < 256 and ids[4] < 256      # the letters: one byte each
    assert [ids[i] for i in (0, 2, 3, 5, 6)] == [151350, 151351, 151347, 151348, 151336]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>a</think><answer>b</answer>"
    assert not {"<think>", "</think>", "<answer>", "</answer>"} & set(tokenizer.all_special_tokens)


def test_generated_ids_round_trip(tokenizer):
    """A random-weight model's reply (ids anywhere in the vocabulary) comes back as the same ids
    when a client sends the text again as history, as with the real tokenizer: a reply of 128
    tokens costs 128 tokens of prompt, not a token per byte of its fillers' names."""
    rng = random.Random(0)
    # ids above the byte range, and whole ASCII characters (a lone byte of a multi-byte
    # character decodes to U+FFFD with any byte-level tokenizer)
    reply = [rng.randrange(256, 151329) if rng.random() < 0.8 else rng.randrange(65, 91)
             for _ in range(128)]
    text = tokenizer.decode(reply, skip_special_tokens=True)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == reply


def test_assistant_history_is_replayed_verbatim(tokenizer):
    turn = "<think>find the app</think><answer>do(action=\"Launch\", app=\"Settings\")</answer>"
    prompt = render(tokenizer, [{"role": "system", "content": "You are a phone agent."},
                                {"role": "user", "content": "open settings"},
                                {"role": "assistant", "content": turn},
                                {"role": "user", "content": "next"}])
    assert prompt == ("[gMASK]<sop><|system|>\nYou are a phone agent.<|user|>\nopen settings"
                      f"<|assistant|>\n{turn}<|user|>\nnext<|assistant|>\n")
    meta = render(tokenizer, [{"role": "assistant", "content": "c", "metadata": "m"}])
    assert meta == "[gMASK]<sop><|assistant|>m\nc<|assistant|>\n"


def test_no_enable_thinking_switch(tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    plain = render(tokenizer, messages)
    assert plain == "[gMASK]<sop><|user|>\nhi<|assistant|>\n"
    assert render(tokenizer, messages, enable_thinking=False) == plain
    assert render(tokenizer, messages, enable_thinking=True) == plain


def test_tool_and_observation_turns_are_not_rendered(tokenizer):
    prompt = render(tokenizer, [{"role": "user", "content": "a"},
                                {"role": "tool", "content": "result"},
                                {"role": "observation", "content": "seen"}])
    assert prompt == "[gMASK]<sop><|user|>\na<|assistant|>\n"


def test_image_and_video_placeholders(tokenizer):
    """Parts become placeholders in order, with nothing between them and the text."""
    prompt = render(tokenizer, [{"role": "user", "content": [
        {"type": "text", "text": "first"}, {"type": "video"}, {"type": "image"},
        {"type": "text", "text": "then"}]}])
    assert prompt == ("[gMASK]<sop><|user|>\nfirst<|begin_of_video|><|video|><|end_of_video|>"
                      "<|begin_of_image|><|image|><|end_of_image|>then<|assistant|>\n")

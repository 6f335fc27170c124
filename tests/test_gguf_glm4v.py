"""GLM-4.1V from llama.cpp's two GGUF files (text model + mmproj vision tower) against
transformers' Glm4vForConditionalGeneration on the same weights, rounded as the files store them
(F32, F16 and Q8_0): config, every tensor, logits and greedy tokens with and without an image,
the tokenizer, and the errors for a missing or foreign mmproj. Plain GLM-4 (one `glm4` GGUF, no
M-RoPE) against Glm4ForCausalLM."""
import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.loader import iter_model_weights, open_gguf, resolve_model_path
from autoglm_serve.loader.gguf_glm4v import neox_to_interleaved
from autoglm_serve.loader.model_path import processor_defaults
from autoglm_serve.tokenizer import load_tokenizer
from tests.glm4v_fixtures import PREPROCESSOR_CONFIG, make_tiny_glm4v, tiny_glm4v_config, tiny_tokenizer
from tests.glm4v_gguf_fixtures import (MMPROJ_FILE, TEXT_FILE, interleaved_to_neox, write_glm4_gguf,
                                       write_glm4v_gguf, write_mmproj)
from tests.test_glm4v_oracle import assert_matches_transformers, random_image

STEPS = 16
MEAN, STD = PREPROCESSOR_CONFIG["image_mean"], PREPROCESSOR_CONFIG["image_std"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(HF checkpoint dir, GGUF dir, HF state dict rounded as the GGUFs store it)."""
    from transformers import AutoTokenizer, Glm4vForConditionalGeneration
    root = tmp_path_factory.mktemp("glm4v_gguf")
    checkpoint = make_tiny_glm4v(root / "hf")
    model = Glm4vForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)
    rounded = write_glm4v_gguf(model, AutoTokenizer.from_pretrained(checkpoint), root / "gguf", MEAN, STD)
    return checkpoint, root / "gguf", rounded


@pytest.fixture(scope="module")
def hf(files):
    from transformers import AutoTokenizer, Glm4vForConditionalGeneration, Glm4vImageProcessorPil
    checkpoint, _, rounded = files
    model = Glm4vForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    model.load_state_dict(rounded, strict=True)
    return (model, AutoTokenizer.from_pretrained(checkpoint),
            Glm4vImageProcessorPil.from_pretrained(checkpoint))


@pytest.fixture(scope="module")
def llm(files):
    _, gguf_dir, _ = files
    return LLM(str(gguf_dir / TEXT_FILE), mmproj=str(gguf_dir / MMPROJ_FILE), dtype="float32",
               block_size=16, max_model_len=2048, max_num_batched_tokens=64)


def test_config_from_metadata_matches_the_checkpoint(files):
    checkpoint, gguf_dir, _ = files
    theirs = tiny_glm4v_config()
    resolved = resolve_model_path(gguf_dir)     # llama.cpp's download layout: model + mmproj-*.gguf
    ours = resolved.config
    assert (resolved.path.name, resolved.mmproj.name) == (TEXT_FILE, MMPROJ_FILE)
    assert type(ours).__name__ == "Glm4vConfig"
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "attention_bias"):
        assert getattr(ours.text_config, field) == getattr(theirs.text_config, field), field
    rope = ours.text_config.rope_parameters
    assert rope["mrope_section"] == [2, 3, 3] and rope["partial_rotary_factor"] == 0.5
    for field in ("hidden_size", "depth", "num_heads", "intermediate_size", "out_hidden_size", "patch_size",
                  "temporal_patch_size", "spatial_merge_size", "image_size", "hidden_act", "attention_bias"):
        assert getattr(ours.vision_config, field) == getattr(theirs.vision_config, field), field
    for field in ("image_token_id", "image_start_token_id", "image_end_token_id", "video_token_id"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.tie_word_embeddings is False
    assert ours.text_config.eos_token_id == theirs.text_config.eos_token_id


def test_every_tensor_is_the_checkpoints_after_undoing_the_conversion(files):
    _, gguf_dir, rounded = files
    types = {t.tensor_type for t in open_gguf(gguf_dir / TEXT_FILE).tensors}
    assert {GGMLQuantizationType.Q8_0, GGMLQuantizationType.F32} <= types     # dequantization is exercised
    ours = dict(iter_model_weights(resolve_model_path(gguf_dir / TEXT_FILE)))
    assert set(ours) == set(rounded)
    for name, tensor in rounded.items():
        assert torch.equal(ours[name], tensor), name


def test_rotary_row_order_round_trips():
    w = np.random.default_rng(0).standard_normal((4 * 32, 16)).astype(np.float32)
    restored = neox_to_interleaved(torch.from_numpy(interleaved_to_neox(w, 32, 16)), 32, 16)
    assert torch.equal(restored, torch.from_numpy(w))
    assert not np.array_equal(interleaved_to_neox(w, 32, 16), w)


CASES = {
    "text": ["tap the settings icon"],
    "one_image": [random_image(84, 140, 1), "where is the back button?"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_tokens_match_transformers(llm, hf, case):
    assert_matches_transformers(llm, hf, CASES[case], STEPS, case)


def test_image_settings_come_from_the_mmproj(llm, files, tmp_path):
    _, gguf_dir, _ = files
    cfg = llm.engine.frontend.mm_processor.image_processor.config
    assert (cfg.image_mean, cfg.image_std) == (pytest.approx(MEAN), pytest.approx(STD))
    assert (cfg.patch_size, cfg.merge_size) == (14, 2)
    size = PREPROCESSOR_CONFIG["size"]       # GLM-4.1V's published limits (the mmproj has none)
    assert (cfg.min_pixels, cfg.max_pixels) == (size["shortest_edge"], size["longest_edge"])

    from transformers import Glm4vForConditionalGeneration
    shutil.copy(gguf_dir / TEXT_FILE, tmp_path / TEXT_FILE)
    write_mmproj(Glm4vForConditionalGeneration(tiny_glm4v_config()), tmp_path / "mmproj-gray.gguf",
                 [0.5] * 3, [0.25] * 3)
    defaults = processor_defaults(resolve_model_path(tmp_path / TEXT_FILE))
    assert defaults["image_mean"] == pytest.approx([0.5] * 3)
    assert defaults["image_std"] == pytest.approx([0.25] * 3)


@pytest.mark.parametrize("source", ["converted", "cached"])
def test_tokenizer_from_the_gguf(files, hf, source, tmp_path, monkeypatch):
    _, gguf_dir, _ = files
    _, reference, _ = hf
    monkeypatch.setenv("AUTOGLM_SERVE_CACHE_DIR", str(tmp_path))
    ours = load_tokenizer(gguf_dir / TEXT_FILE)
    if source == "cached":
        assert any((tmp_path / "gguf-tokenizer").iterdir())
        ours = load_tokenizer(gguf_dir / TEXT_FILE)
    text = "[gMASK]<sop><|user|>\nOpen Settings, then tap 12345 — ok?<|assistant|>\n<think>"
    assert ours.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)
    assert ours.chat_template == reference.chat_template
    # GLM-4's split (numbers in threes), not GPT-2's, as llama.cpp's "glm4" pre-tokenizer
    pieces = [p for p, _ in ours.backend_tokenizer.pre_tokenizer.pre_tokenize_str("12345")]
    assert pieces == ["123", "45"]


def test_text_gguf_without_its_mmproj_says_to_pass_it(files, tmp_path):
    _, gguf_dir, _ = files
    shutil.copy(gguf_dir / TEXT_FILE, tmp_path / TEXT_FILE)
    with pytest.raises(ValueError, match="--mmproj"):
        resolve_model_path(tmp_path / TEXT_FILE)
    with pytest.raises(ValueError, match="--mmproj"):
        LLM(str(tmp_path), dtype="float32")


def test_foreign_or_wrong_mmproj_files_are_refused(files, tmp_path):
    from transformers import Glm4vForConditionalGeneration
    _, gguf_dir, _ = files
    text = gguf_dir / TEXT_FILE

    other = tiny_glm4v_config()                 # a GLM-4.1V whose tower projects to another width
    other.vision_config.out_hidden_size = other.text_config.hidden_size = 64
    write_mmproj(Glm4vForConditionalGeneration(other), tmp_path / "mmproj-other.gguf", MEAN, STD)
    with pytest.raises(ValueError, match="does not belong to this model"):
        resolve_model_path(text, mmproj=tmp_path / "mmproj-other.gguf")

    write_mmproj(Glm4vForConditionalGeneration(tiny_glm4v_config()), tmp_path / "mmproj-qwen.gguf", MEAN, STD,
                 projector="qwen2vl_merger")
    with pytest.raises(ValueError, match="'qwen2vl_merger' projector, not GLM-4.1V's"):
        resolve_model_path(text, mmproj=tmp_path / "mmproj-qwen.gguf")

    with pytest.raises(ValueError, match="is not an mmproj file"):
        resolve_model_path(text, mmproj=text)
    with pytest.raises(FileNotFoundError, match="mmproj file"):
        resolve_model_path(text, mmproj=tmp_path / "missing.gguf")


def test_mmproj_is_refused_where_nothing_takes_it(files, tmp_path):
    checkpoint, gguf_dir, _ = files
    with pytest.raises(ValueError, match="no vision tower to load it into"):
        resolve_model_path(None, mmproj=gguf_dir / MMPROJ_FILE)      # the embedded llama default
    with pytest.raises(ValueError, match="checkpoint directory with its own vision tower"):
        resolve_model_path(checkpoint, mmproj=gguf_dir / MMPROJ_FILE)
    shutil.copy(gguf_dir / MMPROJ_FILE, tmp_path / "mmproj-a.gguf")
    shutil.copy(gguf_dir / MMPROJ_FILE, tmp_path / "mmproj-b.gguf")
    shutil.copy(gguf_dir / TEXT_FILE, tmp_path / TEXT_FILE)
    with pytest.raises(ValueError, match="several mmproj files"):
        resolve_model_path(tmp_path)


def test_serve_takes_mmproj_as_llama_cpp_names_it():
    from autoglm_serve.server.args import build_parser, engine_config_from_args
    args = build_parser().parse_args(["/m/GLM-4.1V-Q4_K_M.gguf", "--mmproj", "/m/mmproj-GLM-4.1V-f16.gguf"])
    config = engine_config_from_args(args)
    assert (config.model, config.mmproj) == ("/m/GLM-4.1V-Q4_K_M.gguf", "/m/mmproj-GLM-4.1V-f16.gguf")


def test_plain_glm4_text_gguf_matches_transformers(files, tmp_path):
    from transformers import Glm4Config, Glm4ForCausalLM
    _, gguf_dir, _ = files
    tc = tiny_glm4v_config().text_config
    config = Glm4Config(vocab_size=tc.vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=True,
                        max_position_embeddings=1024, rms_norm_eps=1e-5, pad_token_id=tc.pad_token_id,
                        eos_token_id=tc.eos_token_id)
    torch.manual_seed(1)
    model = Glm4ForCausalLM(config).eval()
    rounded = write_glm4_gguf(model, tiny_tokenizer(), tmp_path / "GLM-4-tiny-Q8_0.gguf")
    model.load_state_dict(rounded, strict=True)

    with pytest.raises(ValueError, match="takes no mmproj file"):
        resolve_model_path(tmp_path / "GLM-4-tiny-Q8_0.gguf", mmproj=gguf_dir / MMPROJ_FILE)
    llm = LLM(str(tmp_path), dtype="float32", block_size=16, max_model_len=512, max_num_batched_tokens=64)
    assert type(llm.engine.core.loaded.model).__name__ == "Glm4ForCausalLM"
    ids = list(b"[gMASK] open the camera app")
    seen = []
    llm.engine.core.runner.logits_hook = lambda reqs, logits: seen.append(logits[0].clone())
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    seq = torch.tensor([ids + out.outputs[0].token_ids])
    with torch.no_grad():
        ref = model(input_ids=seq).logits[0, len(ids) - 1:-1]
    assert out.outputs[0].token_ids == ref.argmax(-1).tolist()
    for step, (a, b) in enumerate(zip(seen, ref, strict=True)):
        assert ((a - b).norm() / b.norm()).item() < 1e-4, step

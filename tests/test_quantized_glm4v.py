"""GLM-4.1V quantized: the text decoder in W4A16, the vision tower kept 16-bit whichever way the
ignore list spells it (``model.visual.*`` or ``visual.*``), and a checkpoint that does quantize
the vision tower refused with the reason, never half-loaded."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.quantization.config import QuantConfig, WeightScheme
from autoglm_serve.quantization.module_names import is_vision, matches_any
from tests.glm4v_fixtures import make_tiny_glm4v
from tests.quantized_checkpoints import quantize_checkpoint

W4 = WeightScheme("wna16", 4, 128)


@pytest.mark.parametrize("entry", ["model.visual", "visual", "re:model.visual.*", "re:visual.*",
                                   "re:.*visual.*", "model.visual.blocks.0.attn.qkv"])
@pytest.mark.parametrize("module", ["model.visual.blocks.0.attn.qkv", "visual.blocks.0.attn.qkv"])
def test_vision_ignore_entries_match_both_spellings(entry, module):
    assert matches_any([entry], module) and is_vision(module)
    assert QuantConfig("compressed-tensors", W4, ignore=[entry]).scheme_for(module) is None


@pytest.mark.parametrize("entry", ["model.language_model.layers.1.mlp.down_proj",
                                   "model.layers.1.mlp.down_proj", "language_model.model.layers.1",
                                   "re:.*layers\\.1\\.mlp\\.down_proj$"])
def test_decoder_ignore_entries_match_every_layout(entry):
    cfg = QuantConfig("compressed-tensors", W4, ignore=[entry])
    for ours in ("model.layers.1.mlp.down_proj", "language_model.model.layers.1.mlp.down_proj",
                 "model.language_model.layers.1.mlp.down_proj"):
        assert cfg.scheme_for(ours) is None
    assert cfg.scheme_for("model.layers.0.mlp.down_proj") == W4
    assert cfg.scheme_for("model.layers.11.mlp.down_proj") == W4    # not a prefix match


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = make_tiny_glm4v(tmp_path_factory.mktemp("glm4v_w4"))
    quantize_checkpoint(path, "compressed-tensors", group=32, ignore=["re:model.visual.*"])
    return path


def test_w4a16_glm4v_matches_transformers_and_keeps_vision_16_bit(checkpoint):
    from transformers import Glm4vForConditionalGeneration
    oracle = Glm4vForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    llm = LLM(str(checkpoint), dtype="float32", block_size=16, max_model_len=512,
              max_num_batched_tokens=64)
    model = llm.engine.core.loaded.model
    assert model.language_model.model.layers[0].self_attn.qkv_proj.qweight.dtype == torch.int32
    assert all(p.dtype == torch.float32 for p in model.visual.parameters())
    prompt = list(range(40, 70))
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(8):
            ids = torch.cat([ids, oracle(ids).logits[0, -1].argmax().view(1, 1)], dim=1)
    assert out[0].outputs[0].token_ids == ids[0, len(prompt):].tolist()


def test_quantized_vision_weights_are_refused(checkpoint, tmp_path):
    import shutil
    path = tmp_path / "vision_quantized"
    shutil.copytree(checkpoint, path)
    state = load_file(str(path / "model.safetensors"))
    w = state.pop("model.visual.blocks.0.attn.proj.weight")
    state["model.visual.blocks.0.attn.proj.weight_packed"] = torch.zeros(w.shape[0], w.shape[1] // 8,
                                                                         dtype=torch.int32)
    state["model.visual.blocks.0.attn.proj.weight_scale"] = torch.ones(w.shape[0], w.shape[1] // 32)
    save_file(state, str(path / "model.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = ["lm_head"]     # a list that forgot the vision tower
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="quantizes the vision tower.*model.visual.blocks.0"):
        LLM(str(path), dtype="float32", max_model_len=512)


def test_mm_encoder_quantization_fp8(checkpoint):
    """The vision tower in FP8 on request only: image embeddings close to the 16-bit tower's."""
    kw = dict(dtype="float32", block_size=16, max_model_len=512, max_num_batched_tokens=64)
    plain = LLM(str(checkpoint), **kw).engine.core.loaded.model
    fp8 = LLM(str(checkpoint), mm_encoder_quantization="fp8", **kw).engine.core.loaded.model
    assert fp8.visual.blocks[0].attn.qkv.weight.dtype == torch.float8_e4m3fn
    assert fp8.visual.patch_embed.weight.dtype == torch.float32
    assert plain.visual.blocks[0].attn.qkv.weight.dtype == torch.float32
    pixels = torch.randn(16, plain.visual.patch_dim)
    with torch.no_grad():
        a, b = fp8.embed_images(pixels, [[1, 4, 4]]), plain.embed_images(pixels, [[1, 4, 4]])
    assert 1e-4 < ((a - b).norm() / b.norm()).item() < 0.15

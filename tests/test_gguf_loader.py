"""GGUF loading against transformers' own GGUF loading (the oracle) of the same file.

The SmolLM2 comparison loads 135M parameters twice; it is done once in a module-scoped fixture.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from autoglm_serve.loader import default_model_path, iter_gguf_weights, open_gguf, read_gguf_config
from autoglm_serve.loader.gguf_loader import gguf_metadata, unpermute_rotary
from autoglm_serve.tokenizer import load_tokenizer

CONFIG_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
)


def _hf_from_gguf(path: Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.config, model.state_dict()


@pytest.fixture(scope="module")
def reader():
    return open_gguf(default_model_path())  # parse the metadata (~3 s) once for the whole module


@pytest.fixture(scope="module")
def smollm2(reader) -> dict:
    path = default_model_path()
    hf_config, hf_weights = _hf_from_gguf(path)
    return {
        "config": read_gguf_config(reader),
        "weights": dict(iter_gguf_weights(reader)),
        "hf_config": hf_config,
        "hf_weights": hf_weights,
    }


def test_smollm2_config_matches_transformers(smollm2: dict) -> None:
    ours, theirs = smollm2["config"], smollm2["hf_config"]
    for field in CONFIG_FIELDS:
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.tie_word_embeddings and ours.num_key_value_heads < ours.num_attention_heads  # GQA, tied: as SmolLM2


def test_smollm2_every_tensor_matches_transformers(smollm2: dict) -> None:
    ours, theirs = smollm2["weights"], smollm2["hf_weights"]
    # Tied: the file has no output.weight, so we yield no lm_head; transformers' lm_head is the embedding.
    assert set(theirs) - set(ours) == {"lm_head.weight"}
    assert set(ours) <= set(theirs)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32, name
        assert tensor.shape == theirs[name].shape, name
        assert torch.equal(tensor, theirs[name]), name


def test_quantize_source_model_is_transformers_model_of_the_gguf(smollm2: dict) -> None:
    """`quantize`'s source (built from the loader above, not by transformers' GGUF path, which
    parses the file three times) is the model transformers builds, tied head included."""
    from autoglm_serve.quantize.source_model import load_source_model

    source = load_source_model(None)
    weights = source.model.state_dict()
    assert set(weights) == set(smollm2["hf_weights"])
    for name, tensor in weights.items():
        assert torch.equal(tensor, smollm2["hf_weights"][name]), name
    assert source.model.lm_head.weight is source.model.model.embed_tokens.weight
    for field in CONFIG_FIELDS:
        assert getattr(source.model.config, field) == getattr(smollm2["hf_config"], field), field
    assert source.tokenizer.encode("Hello world") == load_tokenizer(default_model_path()).encode("Hello world")


# --- small synthetic GGUFs: untied head, F16 storage, unsupported architecture ---


def _permute_like_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py: HF half-split rotary rows -> interleaved pairs, per head.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(path: Path, model: LlamaForCausalLM, dtype=np.float32, arch: str = "llama") -> None:
    cfg = model.config
    blocks = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    }
    writer = GGUFWriter(path, arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_vocab_size(cfg.vocab_size)
    for name, tensor in model.state_dict().items():
        array = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            gguf_name = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module = rest.removesuffix(".weight")
            gguf_name = f"blk.{layer}.{blocks[module]}.weight"
            if module == "self_attn.q_proj":
                array = _permute_like_llama_cpp(array, cfg.num_attention_heads)
            elif module == "self_attn.k_proj":
                array = _permute_like_llama_cpp(array, cfg.num_key_value_heads)
        # llama.cpp keeps 1-D norms in F32 whatever the file type.
        writer.add_tensor(gguf_name, array.astype(dtype if array.ndim == 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, tie_word_embeddings=False, max_position_embeddings=256, rope_theta=5e5,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("dtype, atol", [(np.float32, 0.0), (np.float16, 1e-3)])
def test_tiny_untied_round_trip(tmp_path: Path, tiny_llama: LlamaForCausalLM, dtype, atol: float) -> None:
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path, tiny_llama, dtype)
    ours = dict(iter_gguf_weights(path))
    original = tiny_llama.state_dict()
    assert set(ours) == set(original)  # untied: lm_head comes from output.weight
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor, original[name], atol=atol, rtol=0, msg=name)
    hf_config, hf_weights = _hf_from_gguf(path)
    for name, tensor in ours.items():
        assert torch.equal(tensor, hf_weights[name]), name
    config = read_gguf_config(path)
    assert not config.tie_word_embeddings
    for field in CONFIG_FIELDS:
        assert getattr(config, field) == getattr(hf_config, field), field


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
    for heads in (1, 2, 3):
        permuted = torch.from_numpy(_permute_like_llama_cpp(w, heads).copy())
        assert torch.equal(unpermute_rotary(permuted, heads), torch.from_numpy(w))


def test_unsupported_architecture(tmp_path: Path, tiny_llama: LlamaForCausalLM) -> None:
    path = tmp_path / "qwen2.gguf"
    _write_tiny_gguf(path, tiny_llama, arch="qwen2")
    with pytest.raises(NotImplementedError, match="'qwen2' is not supported yet"):
        read_gguf_config(path)
    with pytest.raises(NotImplementedError, match="'qwen2' is not supported yet"):
        next(iter_gguf_weights(path))


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"definitely not gguf" * 100)
    with pytest.raises(ValueError, match="bad.gguf"):
        read_gguf_config(path)


# --- tokenizer from the GGUF ---


@pytest.fixture(scope="module")
def reference_tokenizer():
    path = default_model_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module", params=["converted", "cached"])
def tokenizers(request, tmp_path_factory, reference_tokenizer):
    """Ours as converted from the file, then as loaded back from the derived cache."""
    path = default_model_path()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AUTOGLM_SERVE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        ours = load_tokenizer(path)
        if request.param == "cached":
            assert any((Path(os.environ["AUTOGLM_SERVE_CACHE_DIR"]) / "gguf-tokenizer").iterdir())
            ours = load_tokenizer(path)
    return ours, reference_tokenizer


TEXTS = ["Hello world", "  leading spaces and\nnewlines\t", "Unicode: naïve café 東京 🚀", "<|im_start|>user"]


def test_tokenizer_encode_decode_match_transformers(tokenizers) -> None:
    ours, theirs = tokenizers
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ours.decode(ids) == theirs.decode(ids) == text
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
    assert ours.pad_token_id == theirs.pad_token_id
    assert ours.all_special_tokens == theirs.all_special_tokens


def test_chat_template_from_gguf_metadata(tokenizers, reader) -> None:
    ours, theirs = tokenizers
    assert ours.chat_template == gguf_metadata(reader, "tokenizer.chat_template")
    conversation = [{"role": "user", "content": "What is on the screen?"}]
    rendered = ours.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert rendered == theirs.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n") and "What is on the screen?" in rendered

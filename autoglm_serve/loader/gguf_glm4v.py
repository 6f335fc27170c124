"""llama.cpp's `glm4` GGUF: GLM-4 (Glm4ForCausalLM) and the language half of GLM-4.1V.

GLM-4.1V (AutoGLM-Phone-9B) comes as two files: this text GGUF and an mmproj GGUF holding the
vision tower (gguf_mmproj.py). A `glm4` file with `glm4.rope.dimension_sections` is GLM-4.1V's:
llama.cpp writes the sections only for a config with M-RoPE, and then reorders each head's
rotary rows of q and k (see `neox_to_interleaved`), which we undo here.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from gguf import GGUFReader
from transformers import Glm4Config, Glm4vConfig

from autoglm_serve.loader.gguf_loader import (BLOCK_TENSOR_RE, GLOBAL_TENSOR_RE, GGUFSource, gguf_metadata,
                                             iter_dequantized, reject_rope_scaling)
from autoglm_serve.loader.gguf_mmproj import iter_mmproj_weights, mmproj_name, open_mmproj, read_vision_config

# GGUF's per-block names -> the HF Glm4 decoder layer's modules.
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate": "mlp.gate_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",       # GLM-4's name for the norm before the MLP
    "post_attention_norm": "post_self_attn_layernorm",
    "post_ffw_norm": "post_mlp_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "{decoder}embed_tokens", "output_norm": "{decoder}norm", "output": "lm_head"}

# GLM-4.1V's image and video marker tokens, looked up by their text in the GGUF's vocabulary.
_MARKER_TOKENS = {
    "image_token_id": "<|image|>",
    "image_start_token_id": "<|begin_of_image|>",
    "image_end_token_id": "<|end_of_image|>",
    "video_token_id": "<|video|>",
    "video_start_token_id": "<|begin_of_video|>",
    "video_end_token_id": "<|end_of_video|>",
}


def is_glm4v_text(reader: GGUFReader) -> bool:
    return gguf_metadata(reader, "glm4.rope.dimension_sections") is not None


def read_glm4_config(reader: GGUFReader, mmproj: GGUFSource | None) -> Glm4Config | Glm4vConfig:
    """Glm4vConfig for GLM-4.1V's text GGUF with its mmproj, Glm4Config for a plain GLM-4 one."""
    tokens = gguf_metadata(reader, "tokenizer.ggml.tokens") or []
    text = _text_config_kwargs(reader, tokens)
    if not is_glm4v_text(reader):
        if mmproj is not None:
            raise ValueError("this GLM-4 GGUF is a text-only model (no M-RoPE sections); it takes no mmproj file")
        return Glm4Config(**text)
    if mmproj is None:
        raise _missing_mmproj()
    mmproj_reader = open_mmproj(mmproj)
    vision = read_vision_config(mmproj_reader)
    if vision["out_hidden_size"] != text["hidden_size"]:
        raise ValueError(
            f"mmproj {mmproj_name(mmproj_reader)} does not belong to this model: its vision tower projects to "
            f"{vision['out_hidden_size']} features, the language model's hidden size is {text['hidden_size']}"
        )
    tie_word_embeddings = text.pop("tie_word_embeddings")
    return Glm4vConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie_word_embeddings,
                       **_marker_token_ids(tokens))


def _missing_mmproj() -> ValueError:
    return ValueError(
        "this GGUF is the language model of GLM-4.1V (AutoGLM-Phone-9B), whose vision tower is a "
        "separate mmproj GGUF: pass it with --mmproj (LLM(..., mmproj=...)), or put the one "
        "mmproj-*.gguf next to the model file"
    )


def _text_config_kwargs(reader: GGUFReader, tokens: list[str]) -> dict:
    def meta(key: str, default=None):
        return gguf_metadata(reader, f"glm4.{key}", default)

    reject_rope_scaling(reader, "glm4")
    hidden_size = meta("embedding_length")
    num_heads = meta("attention.head_count")
    head_dim = meta("attention.key_length", hidden_size // num_heads)
    rope = {"rope_type": "default", "rope_theta": meta("rope.freq_base", 10000.0),
            # GLM rotates only part of each head: llama.cpp stores that part's width.
            "partial_rotary_factor": meta("rope.dimension_count", head_dim // 2) / head_dim}
    if (sections := meta("rope.dimension_sections")) is not None:
        rope["mrope_section"] = [int(s) for s in sections[:3]]   # padded to 4 with a 0 by llama.cpp
    names = {t.name for t in reader.tensors}
    kwargs = dict(
        vocab_size=meta("vocab_size") or len(tokens),
        hidden_size=hidden_size,
        intermediate_size=meta("feed_forward_length"),
        num_hidden_layers=meta("block_count") - meta("nextn_predict_layers", 0),
        num_attention_heads=num_heads,
        num_key_value_heads=meta("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        max_position_embeddings=meta("context_length"),
        rms_norm_eps=meta("attention.layer_norm_rms_epsilon"),
        rope_parameters=rope,
        attention_bias="blk.0.attn_q.bias" in names,
        tie_word_embeddings="output.weight" not in names,
    )
    eos = _eos_token_ids(reader, tokens)
    if eos:
        kwargs["eos_token_id"] = eos
    if (pad := gguf_metadata(reader, "tokenizer.ggml.padding_token_id")) is not None:
        kwargs["pad_token_id"] = pad
    return kwargs


def _eos_token_ids(reader: GGUFReader, tokens: list[str]) -> list[int]:
    """A GLM turn ends at <|endoftext|>, <|user|> or <|observation|> (GLM-4.1V's config lists all
    three); llama.cpp stores the first as eos, the second as eot and the third not at all."""
    ids = [gguf_metadata(reader, f"tokenizer.ggml.{key}") for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    if "<|observation|>" in tokens:
        ids.append(tokens.index("<|observation|>"))
    return list(dict.fromkeys(i for i in ids if i is not None))


def _marker_token_ids(tokens: list[str]) -> dict[str, int]:
    index = {token: i for i, token in enumerate(tokens)}
    missing = [text for text in _MARKER_TOKENS.values() if text not in index]
    if missing:
        raise ValueError(f"the GGUF's vocabulary lacks GLM-4.1V's image tokens {missing}: not a GLM-4.1V model")
    return {name: index[text] for name, text in _MARKER_TOKENS.items()}


def iter_glm4_weights(reader: GGUFReader, mmproj: GGUFSource | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The language model's tensors under HF GLM-4 names, then the mmproj's under `model.visual.*`."""
    glm4v = is_glm4v_text(reader)
    if glm4v and mmproj is None:
        raise _missing_mmproj()
    num_layers = gguf_metadata(reader, "glm4.block_count") - gguf_metadata(reader, "glm4.nextn_predict_layers", 0)
    num_heads = gguf_metadata(reader, "glm4.attention.head_count")
    hidden_size = gguf_metadata(reader, "glm4.embedding_length")
    head_dim = gguf_metadata(reader, "glm4.attention.key_length", hidden_size // num_heads)
    rotary_dim = gguf_metadata(reader, "glm4.rope.dimension_count", head_dim // 2)
    ffn_rows = gguf_metadata(reader, "glm4.feed_forward_length")
    decoder = "model.language_model." if glm4v else "model."   # the checkpoints' own layouts
    for gguf_name, weight in iter_dequantized(reader):
        hf_name = _hf_text_name(gguf_name, weight, decoder, ffn_rows, num_layers)
        if hf_name is None:
            continue
        if glm4v and gguf_name.endswith((".attn_q.weight", ".attn_q.bias", ".attn_k.weight", ".attn_k.bias")):
            weight = neox_to_interleaved(weight, head_dim, rotary_dim)
        yield hf_name, weight
    if glm4v:
        yield from iter_mmproj_weights(open_mmproj(mmproj))


def _hf_text_name(gguf_name: str, weight: torch.Tensor, decoder: str, ffn_rows: int, num_layers: int) -> str | None:
    """HF name of a text tensor; None for the multi-token-prediction layers we do not run."""
    if match := BLOCK_TENSOR_RE.fullmatch(gguf_name):
        layer, kind, suffix = match.groups()
        if int(layer) >= num_layers:
            return None                         # GLM's NextN (MTP) block after the decoder layers
        if kind == "ffn_up":
            # GLM-4 keeps gate and up in one matrix; llama.cpp stores it whole under ffn_up.
            fused = weight.shape[0] == 2 * ffn_rows
            return f"{decoder}layers.{layer}.mlp.{'gate_up_proj' if fused else 'up_proj'}.{suffix}"
        if kind in _BLOCK_NAMES:
            return f"{decoder}layers.{layer}.{_BLOCK_NAMES[kind]}.{suffix}"
    elif (match := GLOBAL_TENSOR_RE.fullmatch(gguf_name)) and match.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[match.group(1)].format(decoder=decoder)}.{match.group(2)}"
    raise ValueError(f"unexpected tensor {gguf_name!r} in a glm4 GGUF file")


def neox_to_interleaved(weight: torch.Tensor, head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Undo llama.cpp's convert-time reordering of GLM-4.1V's q/k rows.

    GLM rotates adjacent pairs (x0, x1), (x2, x3), ... of each head's first `rotary_dim` rows;
    llama.cpp's M-RoPE kernel rotates halves, so the converter stores those rows as
    [x0, x2, ..., x1, x3, ...]. Interleaving the two halves back restores HF's order.
    """
    heads = weight.reshape(-1, head_dim, *weight.shape[1:])
    rotary = heads[:, :rotary_dim]
    pairs = rotary.reshape(heads.shape[0], 2, rotary_dim // 2, *weight.shape[1:]).transpose(1, 2)
    restored = torch.cat([pairs.reshape(rotary.shape), heads[:, rotary_dim:]], dim=1)
    return restored.reshape(weight.shape)

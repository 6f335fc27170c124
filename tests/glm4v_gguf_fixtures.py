"""A tiny GLM-4.1V as llama.cpp's converter writes it: a `glm4` text GGUF and an mmproj GGUF
(not a test itself); a plain GLM-4 as its one `glm4` GGUF.

``write_glm4v_gguf(model, tokenizer, folder)`` applies what llama.cpp's converter does to the HF
tensors (names, q/k rotary rows reordered for its M-RoPE kernel, the Conv3d patch embedding split
into two Conv2d kernels) and stores a mix of F32, F16 and Q8_0 tensors. It returns the HF state
dict rounded exactly as the file stores it, for the transformers oracle.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import dequantize, quantize

TEXT_FILE = "Tiny-GLM-4.1V-Q8_0.gguf"
MMPROJ_FILE = "mmproj-Tiny-GLM-4.1V-F16.gguf"

_TEXT_BLOCK = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "post_self_attn_layernorm": "post_attention_norm", "post_mlp_layernorm": "post_ffw_norm",
}
_VISION_BLOCK = {"norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_VISION_GLOBAL = {
    "patch_embed.proj.bias": "v.patch_embd.bias", "post_conv_layernorm.weight": "v.norm_embd.weight",
    "embeddings.position_embedding.weight": "v.position_embd.weight", "post_layernorm.weight": "v.post_ln.weight",
    "downsample.weight": "mm.patch_merger.weight", "downsample.bias": "mm.patch_merger.bias",
    "merger.proj.weight": "mm.model.fc.weight", "merger.post_projection_norm.weight": "mm.post_norm.weight",
    "merger.post_projection_norm.bias": "mm.post_norm.bias", "merger.gate_proj.weight": "mm.gate.weight",
    "merger.up_proj.weight": "mm.up.weight", "merger.down_proj.weight": "mm.down.weight",
}


def interleaved_to_neox(w: np.ndarray, head_dim: int, rotary_dim: int) -> np.ndarray:
    """llama.cpp's GLM-4.1V q/k reordering: per head, the rotary rows' even ones, then the odd ones."""
    heads = w.reshape(-1, head_dim, *w.shape[1:])
    rot = heads[:, :rotary_dim]
    return np.concatenate([rot[:, 0::2], rot[:, 1::2], heads[:, rotary_dim:]], axis=1).reshape(w.shape)


def _store(writer: GGUFWriter, name: str, array: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Write one tensor; returns the float32 values a reader gets back."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    if qtype == GGMLQuantizationType.F32:
        writer.add_tensor(name, array)
    elif qtype == GGMLQuantizationType.F16:
        writer.add_tensor(name, array.astype(np.float16))
    else:
        data = quantize(array, qtype)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    return _roundtrip(array, qtype)


def _roundtrip(array: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.float32)
    if qtype == GGMLQuantizationType.F32:
        return array
    if qtype == GGMLQuantizationType.F16:
        return array.astype(np.float16).astype(np.float32)
    return dequantize(quantize(array, qtype), qtype).reshape(array.shape)


def _qtype(array: np.ndarray, quantized: bool) -> GGMLQuantizationType:
    # as llama.cpp: 1-D tensors stay F32; Q8_0 needs rows of whole 32-value blocks
    if array.ndim == 1:
        return GGMLQuantizationType.F32
    if quantized and array.shape[-1] % 32 == 0:
        return GGMLQuantizationType.Q8_0
    return GGMLQuantizationType.F16


def write_glm4v_gguf(model, tokenizer, folder: Path, image_mean, image_std) -> dict[str, torch.Tensor]:
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    rounded: dict[str, np.ndarray] = {}
    _write_text(model.config, tokenizer, state, rounded, folder / TEXT_FILE)
    _write_mmproj(model.config, state, rounded, folder / MMPROJ_FILE, image_mean, image_std)
    return {k: torch.from_numpy(v.copy()) for k, v in rounded.items()}


def write_glm4_gguf(model, tokenizer, path: Path) -> dict[str, torch.Tensor]:
    """A plain GLM-4 (Glm4ForCausalLM) as one text GGUF: no M-RoPE, so no q/k reordering."""
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    rounded: dict[str, np.ndarray] = {}
    _write_text(model.config, tokenizer, state, rounded, path)
    return {k: torch.from_numpy(v.copy()) for k, v in rounded.items()}


def _write_text(config, tokenizer, state, rounded, path: Path) -> None:
    tc = getattr(config, "text_config", config)
    prefix = "model.language_model." if tc is not config else "model."
    head_dim = tc.head_dim
    rope = tc.rope_parameters
    rotary_dim = int(head_dim * rope["partial_rotary_factor"])
    mrope = "mrope_section" in rope         # llama.cpp writes sections and reorders q/k only then
    w = GGUFWriter(path, "glm4")
    w.add_block_count(tc.num_hidden_layers)
    w.add_context_length(tc.max_position_embeddings)
    w.add_embedding_length(tc.hidden_size)
    w.add_feed_forward_length(tc.intermediate_size)
    w.add_head_count(tc.num_attention_heads)
    w.add_head_count_kv(tc.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(tc.rms_norm_eps)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_rope_dimension_count(rotary_dim)
    if mrope:
        w.add_rope_dimension_sections(list(rope["mrope_section"]) + [0])
    w.add_vocab_size(tc.vocab_size)
    _write_tokenizer(w, tokenizer)

    globals_ = {prefix + "embed_tokens": "token_embd", prefix + "norm": "output_norm", "lm_head": "output"}
    for name, array in state.items():
        if name.startswith("model.visual."):
            continue
        module, suffix = name.rsplit(".", 1)
        if module in globals_:
            gguf_name = f"{globals_[module]}.{suffix}"
        else:
            layer, rest = module.removeprefix(prefix + "layers.").split(".", 1)
            gguf_name = f"blk.{layer}.{_TEXT_BLOCK[rest]}.{suffix}"
            if mrope and rest in ("self_attn.q_proj", "self_attn.k_proj"):
                qtype = _qtype(array, quantized=True)
                _store(w, gguf_name, interleaved_to_neox(array, head_dim, rotary_dim), qtype)
                # Q8_0 blocks lie within a row, so rounding commutes with the row reordering
                rounded[name] = _roundtrip(array, qtype)
                continue
        rounded[name] = _store(w, gguf_name, array, _qtype(array, quantized=True))
    _flush(w)


def _write_tokenizer(w: GGUFWriter, tokenizer) -> None:
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    # as llama.cpp: added tokens are CONTROL when special, USER_DEFINED (matched whole) otherwise
    added = {t.content: t.special for t in tokenizer.added_tokens_decoder.values()}
    types = [TokenType.NORMAL if t not in added else TokenType.CONTROL if added[t] else TokenType.USER_DEFINED
             for t in tokens]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("glm4")
    w.add_token_list(tokens)
    w.add_token_types(types)
    # The tiny byte-level vocabulary has no merges, and an empty merges array reads back as none:
    # zero scores let transformers derive the (empty) merges from the vocabulary instead.
    w.add_token_scores([0.0] * len(tokens))
    # llama.cpp's GLM-4 vocabulary: <|endoftext|> is eos, bos, unk; <|user|> ends a turn (eot)
    for add, token in ((w.add_eos_token_id, "<|endoftext|>"), (w.add_bos_token_id, "<|endoftext|>"),
                       (w.add_unk_token_id, "<|endoftext|>"), (w.add_eot_token_id, "<|user|>")):
        add(vocab[token])
    w.add_chat_template(tokenizer.chat_template)


def write_mmproj(model, path: Path, image_mean, image_std, projector: str = "glm4v") -> None:
    """The mmproj file alone (for tests of files that do not belong together)."""
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    _write_mmproj(model.config, state, {}, path, image_mean, image_std, projector)


def _write_mmproj(config, state, rounded, path: Path, image_mean, image_std, projector: str = "glm4v") -> None:
    vc = config.vision_config
    w = GGUFWriter(path, "clip")
    w.add_type("mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", projector)
    w.add_uint32("clip.vision.projection_dim", config.text_config.hidden_size)
    w.add_uint32("clip.vision.image_size", vc.image_size)
    w.add_uint32("clip.vision.patch_size", vc.patch_size)
    w.add_uint32("clip.vision.embedding_length", vc.hidden_size)
    w.add_uint32("clip.vision.feed_forward_length", vc.intermediate_size)
    w.add_uint32("clip.vision.block_count", vc.depth)
    w.add_uint32("clip.vision.attention.head_count", vc.num_heads)
    w.add_array("clip.vision.image_mean", list(image_mean))
    w.add_array("clip.vision.image_std", list(image_std))
    w.add_bool("clip.use_silu", True)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", vc.rms_norm_eps)

    for name, array in state.items():
        if not name.startswith("model.visual."):
            continue
        local = name.removeprefix("model.visual.")
        if local == "patch_embed.proj.weight":       # Conv3d [D, C, 2, P, P] -> one Conv2d per frame
            frames = [_store(w, "v.patch_embd.weight" + suffix, array[:, :, t], GGMLQuantizationType.F16)
                      for t, suffix in enumerate(("", ".1"))]
            rounded[name] = np.stack(frames, axis=2)
            continue
        if local in _VISION_GLOBAL:
            gguf_name = _VISION_GLOBAL[local]
        else:
            _, layer, rest = local.split(".", 2)
            module, suffix = rest.rsplit(".", 1)
            gguf_name = f"v.blk.{layer}.{_VISION_BLOCK[module]}.{suffix}"
        quantized = array.ndim == 2 and "position_embd" not in gguf_name
        rounded[name] = _store(w, gguf_name, array, _qtype(array, quantized))
    _flush(w)


def _flush(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

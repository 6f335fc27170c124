"""Read GGUF files: config from the metadata, weights dequantized under HF names.

The llama architecture is mapped here; GLM-4 / GLM-4.1V (with its separate mmproj file for the
vision tower) in gguf_glm4v.py and gguf_mmproj.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from transformers import LlamaConfig, PretrainedConfig

SUPPORTED_ARCHITECTURES = ("llama", "glm4")

# GGUF's per-block tensor names -> the HF LlamaForCausalLM module they belong to.
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# llama.cpp's tensor names, for every architecture: `blk.N.KIND.weight|bias` and `KIND.weight|bias`
BLOCK_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
GLOBAL_TENSOR_RE = re.compile(r"(\w+)\.(weight|bias)$")


class GGUFFile(GGUFReader):
    """A GGUFReader that knows its path, over a plain ndarray view of its memory map (still
    mapped, nothing copied).

    Parsing slices the map once per string of the vocabulary and merges (~250,000 slices for
    SmolLM2), and np.memmap's Python-level __getitem__ and __array_finalize__ are most of that
    time: this view parses SmolLM2's file in 3.0 s against 7.7 s (a busy 2-core machine)."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__(path)

    @property
    def data(self) -> np.ndarray:
        return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value


GGUFSource = str | Path | GGUFFile


def open_gguf(path: GGUFSource) -> GGUFFile:
    """A GGUFReader (memory-mapped); pass it to both functions below to parse the metadata once."""
    if isinstance(path, GGUFFile):
        return path
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    try:
        return GGUFFile(path)
    except (ValueError, OSError, IndexError) as exc:
        raise ValueError(f"{path}: not a readable GGUF file: {exc}") from exc


def gguf_metadata(reader: GGUFReader, key: str, default=None):
    """One metadata value as a Python scalar/str/list, or `default` when absent."""
    field = reader.get_field(key)
    return default if field is None else field.contents()


def read_gguf_config(path: GGUFSource, mmproj: GGUFSource | None = None) -> PretrainedConfig:
    """The HF config of a GGUF model; `mmproj`: the separate vision-tower file of a multimodal one."""
    reader = open_gguf(path)
    arch = _architecture(reader)
    if arch == "glm4":
        # imported here: gguf_glm4v is built on this module's reading and dequantizing
        from autoglm_serve.loader.gguf_glm4v import read_glm4_config

        return read_glm4_config(reader, mmproj)
    _reject_mmproj(arch, mmproj)
    return _read_llama_config(reader, arch)


def wants_mmproj(path: GGUFSource) -> bool:
    """Whether this text GGUF is the language half of a vision model (its tower is an mmproj file)."""
    reader = open_gguf(path)
    if _architecture(reader) != "glm4":
        return False
    from autoglm_serve.loader.gguf_glm4v import is_glm4v_text

    return is_glm4v_text(reader)


def _read_llama_config(reader: GGUFReader, arch: str) -> LlamaConfig:
    """LlamaConfig equivalent to what transformers builds from the same GGUF's metadata."""

    def meta(key: str, default=None):
        return gguf_metadata(reader, f"{arch}.{key}", default)

    reject_rope_scaling(reader, arch)
    hidden_size = meta("embedding_length")
    num_heads = meta("attention.head_count")
    # transformers takes head_dim from rope.dimension_count for llama; key_length is the explicit form.
    head_dim = meta("attention.key_length", meta("rope.dimension_count", hidden_size // num_heads))
    vocab_size = meta("vocab_size")
    if vocab_size is None:  # older converters only store the token list
        vocab_size = len(reader.fields["tokenizer.ggml.tokens"].data)
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=meta("feed_forward_length"),
        num_hidden_layers=meta("block_count"),
        num_attention_heads=num_heads,
        num_key_value_heads=meta("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        max_position_embeddings=meta("context_length"),
        rms_norm_eps=meta("attention.layer_norm_rms_epsilon"),
        rope_parameters={"rope_type": "default", "rope_theta": meta("rope.freq_base", 10000.0)},
        tie_word_embeddings=all(t.name != "output.weight" for t in reader.tensors),
        **_special_token_ids(reader),
    )


def _special_token_ids(reader: GGUFReader) -> dict[str, int]:
    # Only ids the file states: absent ones keep LlamaConfig's defaults, as transformers' GGUF loading does.
    keys = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "padding_token_id"}
    ids = {name: gguf_metadata(reader, f"tokenizer.ggml.{key}") for name, key in keys.items()}
    return {name: value for name, value in ids.items() if value is not None}


def iter_gguf_weights(path: GGUFSource, mmproj: GGUFSource | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, float32 tensor) for every GGUF tensor, dequantized, in HF layout.

    A tied checkpoint has no `output.weight`, so no `lm_head.weight` is yielded; the model ties it.
    """
    reader = open_gguf(path)
    arch = _architecture(reader)
    if arch == "glm4":
        from autoglm_serve.loader.gguf_glm4v import iter_glm4_weights

        yield from iter_glm4_weights(reader, mmproj)
        return
    _reject_mmproj(arch, mmproj)
    num_heads = gguf_metadata(reader, f"{arch}.attention.head_count")
    num_kv_heads = gguf_metadata(reader, f"{arch}.attention.head_count_kv", num_heads)
    for gguf_name, weight in iter_dequantized(reader):
        hf_name = gguf_to_hf_name(gguf_name)
        if gguf_name.endswith(("attn_q.weight", "attn_q.bias")):
            weight = unpermute_rotary(weight, num_heads)
        elif gguf_name.endswith(("attn_k.weight", "attn_k.bias")):
            weight = unpermute_rotary(weight, num_kv_heads)
        yield hf_name, weight


def iter_dequantized(reader: GGUFReader) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, float32 tensor in torch's dim order) for every tensor of the file, one at a time."""
    for tensor in reader.tensors:
        # GGUF lists dims fastest-first (ggml ne[]); numpy/torch want them slowest-first.
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        array = dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32, copy=False)
        if not array.flags.writeable:  # F32 tensors come back as views of the read-only memory map
            array = array.copy()
        yield tensor.name, torch.from_numpy(array)


def gguf_to_hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; raises on names we don't know."""
    if match := BLOCK_TENSOR_RE.fullmatch(gguf_name):
        layer, kind, suffix = match.groups()
        if kind in _BLOCK_NAMES:
            return f"model.layers.{layer}.{_BLOCK_NAMES[kind]}.{suffix}"
    elif match := GLOBAL_TENSOR_RE.fullmatch(gguf_name):
        kind, suffix = match.groups()
        if kind in _GLOBAL_NAMES:
            return f"{_GLOBAL_NAMES[kind]}.{suffix}"
        if kind == "rope_freqs":
            # Llama-3.1-style frequency scaling; dropping it silently would give wrong long-context rotary.
            raise NotImplementedError("GGUF tensor rope_freqs (llama3 rope scaling) is not supported yet")
    raise ValueError(f"unexpected tensor {gguf_name!r} in a llama GGUF file")


def unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's convert-time q/k row permutation.

    llama.cpp reorders each head's rows from HF's half-split rotary layout [x0..x(d/2-1), y0..] to
    interleaved pairs [x0, y0, x1, y1, ...]; swapping the (pair, half) axes back restores HF order.
    """
    rows = weight.shape[0]
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _architecture(reader: GGUFReader) -> str:
    arch = gguf_metadata(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise NotImplementedError(
            f"GGUF architecture {arch!r} is not supported yet (supported: {', '.join(SUPPORTED_ARCHITECTURES)}); "
            "use the model's safetensors checkpoint instead"
        )
    return arch


def _reject_mmproj(arch: str, mmproj: GGUFSource | None) -> None:
    if mmproj is not None:
        raise ValueError(f"an mmproj file was given, but the {arch!r} GGUF has no vision tower to load it into")


def reject_rope_scaling(reader: GGUFReader, arch: str) -> None:
    scaling = gguf_metadata(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise NotImplementedError(f"GGUF rope scaling {scaling!r} is not supported yet")

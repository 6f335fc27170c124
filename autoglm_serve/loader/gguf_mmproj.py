"""llama.cpp's mmproj GGUF of GLM-4.1V: the vision tower's config, weights and image settings.

llama.cpp's converter writes GLM-4.1V's `model.visual.*` tensors to a separate file
(`general.architecture` "clip", `clip.projector_type` "glm4v") under CLIP-style names, and splits
the patch embedding's Conv3d (temporal kernel 2) into two Conv2d kernels, `v.patch_embd.weight`
and `v.patch_embd.weight.1`, one per frame; we stack them back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from gguf import GGUFReader

from autoglm_serve.loader.gguf_loader import GGUFFile, GGUFSource, gguf_metadata, iter_dequantized, open_gguf

GLM4V_PROJECTOR = "glm4v"
# AutoGLM-Phone-9B's preprocessor_config.json, shipped with the package
PUBLISHED_PREPROCESSOR = (Path(__file__).resolve().parents[1] / "models" / "configs" / "autoglm-phone-9b"
                          / "preprocessor_config.json")

# mmproj name -> HF name under model.visual.
_GLOBAL_NAMES = {
    "v.patch_embd.bias": "patch_embed.proj.bias",
    "v.norm_embd.weight": "post_conv_layernorm.weight",
    "v.position_embd.weight": "embeddings.position_embedding.weight",
    "v.post_ln.weight": "post_layernorm.weight",
    "mm.patch_merger.weight": "downsample.weight",
    "mm.patch_merger.bias": "downsample.bias",
    "mm.model.fc.weight": "merger.proj.weight",
    "mm.post_norm.weight": "merger.post_projection_norm.weight",
    "mm.post_norm.bias": "merger.post_projection_norm.bias",
    "mm.gate.weight": "merger.gate_proj.weight",
    "mm.up.weight": "merger.up_proj.weight",
    "mm.down.weight": "merger.down_proj.weight",
}
_BLOCK_NAMES = {
    "ln1": "norm1",
    "ln2": "norm2",
    "attn_qkv": "attn.qkv",
    "attn_out": "attn.proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)$")
_PATCH_KERNELS = ("v.patch_embd.weight", "v.patch_embd.weight.1")   # frame 0, frame 1


def open_mmproj(source: GGUFSource) -> GGUFReader:
    """The mmproj file, checked to hold a GLM-4.1V vision tower."""
    reader = open_gguf(source)
    name = mmproj_name(reader)
    if gguf_metadata(reader, "general.architecture") != "clip":
        raise ValueError(f"{name} is not an mmproj file (general.architecture is "
                         f"{gguf_metadata(reader, 'general.architecture')!r}, expected 'clip')")
    projector = gguf_metadata(reader, "clip.vision.projector_type") or gguf_metadata(reader, "clip.projector_type")
    if not gguf_metadata(reader, "clip.has_vision_encoder", False) or projector != GLM4V_PROJECTOR:
        raise ValueError(f"mmproj {name} holds a {projector!r} projector, not GLM-4.1V's {GLM4V_PROJECTOR!r}: "
                         "it belongs to another model")
    return reader


def mmproj_name(reader: GGUFFile) -> str:
    return repr(reader.path.name)


def read_vision_config(reader: GGUFReader) -> dict:
    """Glm4vVisionConfig fields from the metadata; what the metadata leaves out from tensor shapes."""
    def meta(key: str, default=None):
        return gguf_metadata(reader, f"clip.vision.{key}", default)

    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
    missing = [n for n in (*_PATCH_KERNELS, "mm.patch_merger.weight") if n not in shapes]
    if missing:
        raise ValueError(f"mmproj {mmproj_name(reader)} lacks GLM-4.1V vision tensors {missing}")
    out_channels, in_channels, *_ = shapes["v.patch_embd.weight"]
    merge = shapes["mm.patch_merger.weight"][-1]         # the downsample conv's kernel = merge window
    act = "gelu" if gguf_metadata(reader, "clip.use_gelu", False) else "silu"
    return dict(
        hidden_size=meta("embedding_length", out_channels),
        depth=meta("block_count"),
        num_heads=meta("attention.head_count"),
        intermediate_size=meta("feed_forward_length"),   # the merger's inner width, as in HF's config
        out_hidden_size=meta("projection_dim"),
        patch_size=meta("patch_size"),
        image_size=meta("image_size"),
        in_channels=in_channels,
        temporal_patch_size=len(_PATCH_KERNELS),
        spatial_merge_size=meta("spatial_merge_size", merge),
        rms_norm_eps=meta("attention.layer_norm_epsilon", 1e-5),
        hidden_act=act,
        attention_bias="v.blk.0.attn_qkv.bias" in shapes,
    )


def image_processor_defaults(source: GGUFSource) -> dict:
    """The image settings of a GLM-4.1V GGUF: what the mmproj states (normalization, patch and
    merge sizes), over GLM-4.1V's published pixel limits, which the file does not carry."""
    reader = open_gguf(source)
    vision = read_vision_config(reader)
    published = json.loads(PUBLISHED_PREPROCESSOR.read_text())["size"]
    settings = {"min_pixels": published["shortest_edge"], "max_pixels": published["longest_edge"],
                "patch_size": vision["patch_size"], "merge_size": vision["spatial_merge_size"],
                "image_mean": gguf_metadata(reader, "clip.vision.image_mean"),
                "image_std": gguf_metadata(reader, "clip.vision.image_std")}
    return {key: value for key, value in settings.items() if value is not None}


def iter_mmproj_weights(reader: GGUFReader) -> Iterator[tuple[str, torch.Tensor]]:
    """The vision tower's tensors, dequantized, under HF's `model.visual.*` checkpoint names."""
    frames: dict[str, torch.Tensor] = {}
    for gguf_name, weight in iter_dequantized(reader):
        if gguf_name in _PATCH_KERNELS:
            frames[gguf_name] = weight
            if len(frames) == len(_PATCH_KERNELS):      # [D, C, P, P] per frame -> Conv3d's [D, C, T, P, P]
                yield "model.visual.patch_embed.proj.weight", torch.stack([frames[n] for n in _PATCH_KERNELS], dim=2)
            continue
        yield "model.visual." + _hf_vision_name(gguf_name, reader), weight


def _hf_vision_name(gguf_name: str, reader: GGUFReader) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if (match := _BLOCK_RE.fullmatch(gguf_name)) and match.group(2) in _BLOCK_NAMES:
        layer, kind, suffix = match.groups()
        return f"blocks.{layer}.{_BLOCK_NAMES[kind]}.{suffix}"
    raise ValueError(f"unexpected tensor {gguf_name!r} in GLM-4.1V mmproj {mmproj_name(reader)}")


def find_mmproj_beside(model_file: Path) -> Path | None:
    """The one `mmproj*.gguf` in the model file's folder (llama.cpp's download layout; vLLM looks
    there too); None when there is none, an error when several could be meant."""
    found = sorted(p for p in model_file.parent.glob("*.gguf") if is_mmproj_name(p))
    if len(found) > 1:
        raise ValueError(f"several mmproj files next to {model_file.name}: {[p.name for p in found]}; "
                         "pick one with --mmproj")
    return found[0] if found else None


def is_mmproj_name(path: Path) -> bool:
    return path.name.lower().startswith("mmproj")

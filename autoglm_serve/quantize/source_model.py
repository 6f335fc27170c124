"""The model to quantize, as a transformers model: the embedded default (GGUF), or an HF directory.

Resolved with the server's own `resolve_model_path`, so `quantize` accepts what `serve` accepts
(never a hub name). A GGUF is dequantized by transformers on load.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from autoglm_serve.loader.model_path import resolve_model_path


@dataclass
class SourceModel:
    model: torch.nn.Module
    tokenizer: object
    files_dir: Path | None   # where the tokenizer/processor files are, None for a GGUF
    is_vision: bool


def load_source_model(model: str | Path | None, dtype: torch.dtype = torch.float32) -> SourceModel:
    import transformers

    resolved = resolve_model_path(model)
    if resolved.format == "gguf":
        kw = dict(gguf_file=resolved.path.name)
        hf = transformers.AutoModelForCausalLM.from_pretrained(resolved.path.parent, dtype=dtype, **kw)
        tok = transformers.AutoTokenizer.from_pretrained(resolved.path.parent, **kw)
        # the weights are dequantized floats now: drop the GGUF marker that forbids saving
        hf.hf_quantizer = None
        if hasattr(hf.config, "quantization_config"):
            del hf.config.quantization_config
        return SourceModel(hf.eval(), tok, None, False)
    if resolved.format != "safetensors":
        raise ValueError(f"{resolved.path} has a config but no weights: nothing to quantize")
    architectures = getattr(resolved.config, "architectures", None) or []
    cls = getattr(transformers, architectures[0], None) if architectures else None
    if cls is None:
        raise ValueError(f"{resolved.path}: unknown architecture {architectures}")
    hf = cls.from_pretrained(resolved.path, dtype=dtype)
    tok = transformers.AutoTokenizer.from_pretrained(resolved.path)
    is_vision = getattr(resolved.config, "vision_config", None) is not None
    return SourceModel(hf.eval(), tok, resolved.path, is_vision)

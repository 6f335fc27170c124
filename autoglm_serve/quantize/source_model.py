"""The model to quantize, as a transformers model: the embedded default (GGUF), or an HF directory.

Resolved with the server's own `resolve_model_path`, so `quantize` accepts what `serve` accepts
(never a hub name). A GGUF is read by the server's own GGUF loader (config, dequantized weights in
transformers' names and layout) and tokenizer (cached conversion): the same model transformers'
GGUF loading builds, which parses the file three times over (SmolLM2: 29 s against ~7).
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
        return _load_gguf(resolved.path, dtype)
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


def _load_gguf(path: Path, dtype: torch.dtype) -> SourceModel:
    import transformers
    from transformers.initialization import no_init_weights

    from autoglm_serve.loader.gguf_loader import iter_gguf_weights, open_gguf, read_gguf_config
    from autoglm_serve.tokenizer import load_tokenizer

    reader = open_gguf(path)       # parsed once for the config and the weights
    config = read_gguf_config(reader)
    with no_init_weights():        # every parameter is assigned from the file below
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    weights = {name: w.to(dtype) for name, w in iter_gguf_weights(reader)}
    missing, unexpected = hf.load_state_dict(weights, strict=False, assign=True)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"{path}: weights missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")
    hf.tie_weights()
    return SourceModel(hf.eval(), load_tokenizer(path), None, False)

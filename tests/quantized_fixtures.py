"""Tiny quantized checkpoints for tests (not a test itself): the output of `autoglm-serve quantize`
on the tiny random GLM-4.1V, for loading in transformers and in our engine.

``make_tiny_quantized_glm4v(tmp, method)`` returns (source_dir, quantized_dir).
"""
from __future__ import annotations

from pathlib import Path

import torch

from glm4v_fixtures import make_tiny_glm4v


def make_tiny_quantized_glm4v(tmp: str | Path, method: str = "gptq", dtype: torch.dtype = torch.float32,
                              **options) -> tuple[Path, Path]:
    from autoglm_serve.quantize.pipeline import write_quantized_checkpoint

    tmp = Path(tmp)
    source = make_tiny_glm4v(tmp / "source")
    options.setdefault("num_samples", 4)
    options.setdefault("max_tokens", 256)
    out = write_quantized_checkpoint(source, tmp / f"quantized-{method}", method, dtype=dtype, **options)
    return source, out


def decompressed_reference(path: str | Path, model_class, dtype: torch.dtype = torch.float32):
    """The checkpoint at `path` decoded by compressed-tensors' own per-module path: a model
    built from its config, given each module's scheme (apply_quantization_config), compressed
    to the stored layout, loaded, and decompressed. transformers' dequantize-at-load path
    decodes every dense module with the first config group's scheme (transformers 5.25), so a
    checkpoint with Linears at two bit widths needs this one as its oracle."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    quantization = QuantizationConfig.model_validate(config.quantization_config)
    del config.quantization_config
    model = model_class._from_config(config, dtype=dtype).eval()
    compressor = ModelCompressor(quantization_config=quantization)
    apply_quantization_config(model, quantization)
    compressor.compress_model(model)
    state = {}
    for shard in sorted(Path(path).glob("*.safetensors")):
        state.update(load_file(shard))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    assert set(missing) <= tied and not unexpected, (missing, unexpected)
    compressor.decompress_model(model)
    return model

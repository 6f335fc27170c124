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

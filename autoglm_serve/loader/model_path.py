"""Turn the user's `--model` into a local checkpoint: embedded default, a .gguf file, or an HF directory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoConfig, PretrainedConfig

from autoglm_serve.loader.default_model import default_model_path
from autoglm_serve.loader.gguf_loader import iter_gguf_weights, read_gguf_config
from autoglm_serve.loader.safetensors_loader import INDEX_FILE, SINGLE_FILE, iter_safetensors_weights

ModelFormat = Literal["safetensors", "gguf", "dir-config-only"]


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # the .gguf file, or the checkpoint directory
    format: ModelFormat  # "dir-config-only": config.json without weights, servable only with dummy weights
    config: PretrainedConfig


def resolve_model_path(model: str | Path | None) -> ResolvedModel:
    """Resolve locally only: autoglm-serve never looks a name up on a model hub."""
    if model is None:
        path = default_model_path()
        return ResolvedModel(path, "gguf", read_gguf_config(path))
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel(path, "gguf", read_gguf_config(path))
    if path.is_dir():
        if (path / "config.json").is_file():
            return ResolvedModel(path, _dir_format(path), _load_dir_config(path))
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:  # a directory holding one GGUF (e.g. a llama.cpp download) means that file
            return ResolvedModel(ggufs[0], "gguf", read_gguf_config(ggufs[0]))
        found = sorted(p.name for p in path.iterdir())
        raise ValueError(
            f"model directory {str(path)!r} has no config.json"
            + (f" and several .gguf files (pick one): {[p.name for p in ggufs]}" if ggufs else f"; found: {found or 'nothing'}")
        )
    if path.exists():
        raise ValueError(f"unknown model path {str(path)!r}: expected a .gguf file or a directory with config.json")
    raise FileNotFoundError(
        f"unknown model path {str(path)!r}: no such file or directory "
        "(give a local .gguf file or a directory with config.json; models are never downloaded)"
    )


def _dir_format(path: Path) -> ModelFormat:
    if (path / INDEX_FILE).is_file() or (path / SINGLE_FILE).is_file():
        return "safetensors"
    return "dir-config-only"


def _load_dir_config(path: Path) -> PretrainedConfig:
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise ValueError(f"{path / 'config.json'}: cannot load model config: {exc}") from exc


def iter_model_weights(resolved: ResolvedModel) -> Iterator[tuple[str, torch.Tensor]]:
    """(hf_name, tensor) pairs from whichever format `resolved` is in."""
    if resolved.format == "gguf":
        return iter_gguf_weights(resolved.path)
    if resolved.format == "safetensors":
        return iter_safetensors_weights(resolved.path)
    raise ValueError(f"{resolved.path} has a config but no weights: load it with dummy weights")

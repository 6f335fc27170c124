"""Turn the user's `--model` into a local checkpoint: embedded default, a .gguf file (with its mmproj
file for a vision model), or an HF directory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoConfig, PretrainedConfig

from autoglm_serve.loader.default_model import default_model_path
from autoglm_serve.loader.gguf_loader import iter_gguf_weights, open_gguf, read_gguf_config, wants_mmproj
from autoglm_serve.loader.gguf_mmproj import find_mmproj_beside, image_processor_defaults, is_mmproj_name
from autoglm_serve.loader.hub import hub_path
from autoglm_serve.loader.safetensors_loader import INDEX_FILE, SINGLE_FILE, iter_safetensors_weights

ModelFormat = Literal["safetensors", "gguf", "dir-config-only"]


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # the .gguf file, or the checkpoint directory
    format: ModelFormat  # "dir-config-only": config.json without weights, servable only with dummy weights
    config: PretrainedConfig
    mmproj: Path | None = None  # a GGUF vision model's separate vision-tower file


def resolve_model_path(model: str | Path | None, mmproj: str | Path | None = None,
                       revision: str | None = None, download_dir: str | None = None,
                       weights: bool = True, download: bool = True) -> ResolvedModel:
    """A local path first; a name that is none but reads as a Hub id (`owner/name`, or
    `owner/name:QUANT` for a GGUF repository's file) is found in or (with download) fetched
    into the Hugging Face cache (hub.py; `revision`, `download_dir` as vLLM's flags; without
    `weights`, its config and tokenizer only).

    `mmproj`: the vision-tower GGUF of a GGUF vision model (llama.cpp's `--mmproj`); without it,
    the one `mmproj*.gguf` next to a model file that needs one is taken.
    """
    mmproj_path = Path(mmproj).expanduser() if mmproj is not None else None
    if model is None:
        path = default_model_path()
        return _resolve_gguf(path, mmproj_path)
    fetched = hub_path(str(model), revision, download_dir, weights, download)
    from_hub = fetched is not None
    path = fetched or Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _resolve_gguf(path, mmproj_path)
    if path.is_dir():
        if (path / "config.json").is_file():
            _reject_mmproj_for(path, mmproj_path)
            return ResolvedModel(path, _dir_format(path), _load_dir_config(path))
        ggufs = sorted(p for p in path.glob("*.gguf") if not is_mmproj_name(p))
        if len(ggufs) == 1:  # a directory holding one model GGUF (e.g. a llama.cpp download) means that file
            return _resolve_gguf(ggufs[0], mmproj_path)
        if from_hub:
            raise ValueError(f"{model!r} has no config.json: for a GGUF repository, name the "
                             f"quantization as llama.cpp's -hf does ({model}:Q4_K_M)")
        found = sorted(p.name for p in path.iterdir())
        raise ValueError(
            f"model directory {str(path)!r} has no config.json"
            + (f" and several .gguf files (pick one): {[p.name for p in ggufs]}" if ggufs else f"; found: {found or 'nothing'}")
        )
    if path.exists():
        raise ValueError(f"unknown model path {str(path)!r}: expected a .gguf file or a directory with config.json")
    raise FileNotFoundError(
        f"unknown model path {str(path)!r}: no such file or directory "
        "(give a local .gguf file, a directory with config.json, or a Hugging Face Hub id "
        "owner/name)"
    )


def _resolve_gguf(path: Path, mmproj: Path | None) -> ResolvedModel:
    if mmproj is not None and not mmproj.is_file():
        raise FileNotFoundError(f"mmproj file {str(mmproj)!r} does not exist")
    reader = open_gguf(path)  # parsed once: seconds for a large vocabulary
    if mmproj is None and wants_mmproj(reader):
        mmproj = find_mmproj_beside(path)
    return ResolvedModel(path, "gguf", read_gguf_config(reader, mmproj), mmproj)


def _reject_mmproj_for(path: Path, mmproj: Path | None) -> None:
    if mmproj is not None:
        raise ValueError(f"--mmproj is for GGUF models; {str(path)!r} is a checkpoint directory "
                         "with its own vision tower")


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
        return iter_gguf_weights(resolved.path, resolved.mmproj)
    if resolved.format == "safetensors":
        return iter_safetensors_weights(resolved.path)
    raise ValueError(f"{resolved.path} has a config but no weights: load it with dummy weights")


def processor_defaults(resolved: ResolvedModel) -> dict:
    """Image settings a GGUF vision model's mmproj states (a checkpoint directory's are read from
    its preprocessor_config.json by the image processor itself)."""
    return image_processor_defaults(resolved.mmproj) if resolved.mmproj is not None else {}

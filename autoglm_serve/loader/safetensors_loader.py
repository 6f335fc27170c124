"""Stream weights out of a Hugging Face safetensors checkpoint (single file or sharded)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The checkpoint's shard files in load order; raises if the directory holds no safetensors checkpoint."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist or is not a directory")
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        shards = list(_read_index(index_path))
        missing = [name for name in shards if not (model_dir / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{index_path}: shard files named by the index are missing: {missing}")
        return [model_dir / name for name in shards]
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    found = sorted(p.name for p in model_dir.iterdir())
    raise FileNotFoundError(
        f"no safetensors checkpoint in {str(model_dir)!r}: expected {SINGLE_FILE} or {INDEX_FILE} "
        f"(only safetensors is supported; .bin/.pt are not); found: {found if found else 'nothing'}"
    )


def iter_safetensors_weights(model_dir: str | Path, device: str | torch.device = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, tensor) for every tensor of the checkpoint, opening each shard once and lazily.

    Tensors come out in the checkpoint's own names and dtype; the model maps them onto its parameters.
    """
    model_dir = Path(model_dir)
    index_path = model_dir / INDEX_FILE
    expected = _read_index(index_path) if index_path.is_file() else None
    for shard in safetensors_files(model_dir):
        with _open(shard, device) as handle:
            names = list(handle.keys())
            if expected is not None:
                absent = sorted(expected[shard.name] - set(names))
                if absent:
                    raise ValueError(f"{shard}: tensors named by {INDEX_FILE} are missing from this shard: {absent[:10]}"
                                     + (f" (and {len(absent) - 10} more)" if len(absent) > 10 else ""))
            for name in names:
                try:
                    tensor = handle.get_tensor(name)
                except SafetensorError as exc:
                    raise ValueError(f"{shard}: cannot read tensor {name!r}: {exc}") from exc
                yield name, tensor


def _read_index(index_path: Path) -> dict[str, set[str]]:
    """Shard file name -> tensor names it must hold, in order of first appearance in the index."""
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{index_path}: not a valid safetensors index (needs a 'weight_map' object): {exc}") from exc
    shards: dict[str, set[str]] = {}
    for tensor_name, shard_name in weight_map.items():
        shards.setdefault(shard_name, set()).add(tensor_name)
    return shards


def _open(path: Path, device: str | torch.device):
    # safe_open validates the header against the file size, so truncation and garbage surface here.
    try:
        return safe_open(str(path), framework="pt", device=str(device))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path}: corrupt or truncated safetensors file: {exc}") from exc

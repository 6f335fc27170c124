"""Mapping checkpoint tensors (Hugging Face names) onto our fused parameters."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from autoglm_serve.models.layers.linear import default_weight_loader

# (our fused parameter fragment, checkpoint fragment, shard id)
STACKED_QKV_GATE_UP = [
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
]


def load_stacked_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                         stacked=STACKED_QKV_GATE_UP, skip=(), rename=None) -> set[str]:
    """Loads every tensor into its parameter; returns the names of the parameters loaded.

    ``rename`` maps a checkpoint name to ours (or None to skip it); tensors whose name contains
    any of ``skip`` (rotary caches, tied heads) are ignored.
    """
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        if rename is not None:
            name = rename(name)
            if name is None:
                continue
        if any(s in name for s in skip):
            continue
        for ours, theirs, shard_id in stacked:
            if f".{theirs}." in name:
                target = name.replace(f".{theirs}.", f".{ours}.")
                param = params[target]
                param.weight_loader(param, tensor, shard_id)
                loaded.add(target)
                break
        else:
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no parameter in "
                                 f"{type(model).__name__}")
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                default_weight_loader(param, tensor)
            else:
                loader(param, tensor)
            loaded.add(name)
    return loaded


def check_all_loaded(model: nn.Module, loaded: set[str], tied: tuple[str, ...] = ()) -> None:
    missing = [n for n, _ in model.named_parameters() if n not in loaded and n not in tied]
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"checkpoint is missing {len(missing)} tensors: {missing[:5]}{more}")

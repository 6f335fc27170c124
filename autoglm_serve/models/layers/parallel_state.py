"""Tensor-parallel rank and world size as the layers see them.

Single-GPU serving runs with world size 1; the layers already shard by these numbers so that a
multi-GPU runner only has to set them (and add the all-reduce in RowParallelLinear).
"""
from dataclasses import dataclass


@dataclass
class TensorParallelState:
    rank: int = 0
    world_size: int = 1


_STATE = TensorParallelState()


def tp_rank() -> int:
    return _STATE.rank


def tp_world_size() -> int:
    return _STATE.world_size

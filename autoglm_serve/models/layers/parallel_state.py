"""Tensor-parallel rank and world size as the layers see them.

Single-GPU serving runs with world size 1. Under tensor parallelism (engine/parallel/) every
rank sets them before it builds the model, so the layers build only their own shard; their
collectives run on torch.distributed's default group (NCCL on CUDA, gloo on CPU).
``mm_encoder_tp_mode`` says whether the vision tower is replicated and run on a share of the
images per rank ("data") or sharded like the decoder ("weights").
"""
from dataclasses import dataclass


@dataclass
class TensorParallelState:
    rank: int = 0
    world_size: int = 1
    mm_encoder_tp_mode: str = "data"


_STATE = TensorParallelState()


def tp_rank() -> int:
    return _STATE.rank


def tp_world_size() -> int:
    return _STATE.world_size


def mm_encoder_tp_mode() -> str:
    return _STATE.mm_encoder_tp_mode


def set_tensor_parallel(rank: int, world_size: int, mm_encoder_tp_mode: str = "data") -> None:
    _STATE.rank, _STATE.world_size = rank, world_size
    _STATE.mm_encoder_tp_mode = mm_encoder_tp_mode

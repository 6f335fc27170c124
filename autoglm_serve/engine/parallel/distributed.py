"""The process groups of a tensor-parallel engine and what travels on them.

Two groups: torch.distributed's default one carries the model's collectives (NCCL on CUDA, so
they can be captured in CUDA graphs; gloo on CPU), and a gloo group on the host carries the
control traffic: one broadcast of the step's packed inputs per step, the start-up agreements.
Workers wait on the control group between requests, so its timeout is long; a rank that dies
is noticed at once anyway (gloo's sockets close; engine/parallel/workers.py watches the
processes).
"""
from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

# A collective of a step waits at most this long for the slowest rank.
DEVICE_TIMEOUT = datetime.timedelta(minutes=10)
# Idle workers wait on the next step's broadcast for as long as the server runs.
CONTROL_TIMEOUT = datetime.timedelta(days=365)


class TensorParallelFailure(RuntimeError):
    """A rank is gone or a step failed after its inputs went to the workers: the ranks can no
    longer run in lockstep, so the engine cannot go on (engine/core/fault_isolation.py)."""


@dataclass
class Groups:
    control: dist.ProcessGroup
    device: torch.device


def rank_device(base: torch.device, rank: int) -> torch.device:
    """Rank r's device: the r-th GPU from the configured one (cuda:0 unless given), or the CPU."""
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + rank)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_groups(rank: int, world_size: int, port: int, device: torch.device) -> Groups:
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process: shut the "
                           "other tensor-parallel engine down first (LLM.shutdown())")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=DEVICE_TIMEOUT,
                            device_id=device if device.type == "cuda" else None)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return Groups(control, device)


def destroy_groups() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_object(groups: Groups, obj=None):
    """Rank 0's ``obj`` on every rank (pickled; two small gloo broadcasts: size, bytes)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=groups.control)
    return box[0]


def agree_min(groups: Groups, value: int) -> int:
    """The smallest of every rank's value (KV blocks that fit, whether to capture graphs)."""
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=groups.control)
    return int(t.item())


def check_shardable(hf_config, world_size: int, mm_encoder_tp_mode: str) -> None:
    """Raises, before anything starts, when the model does not split over world_size ranks."""
    text = getattr(hf_config, "text_config", None) or hf_config
    heads, kv = text.num_attention_heads, text.num_key_value_heads
    problems = []
    if heads % world_size:
        problems.append(f"its {heads} attention heads")
    if kv % world_size and world_size % kv:
        problems.append(f"its {kv} KV heads (nor is it a multiple of them)")
    if text.intermediate_size % world_size:
        problems.append(f"its MLP width {text.intermediate_size}")
    vision = getattr(hf_config, "vision_config", None)
    if vision is not None and mm_encoder_tp_mode == "weights":
        for what, n in (("vision heads", vision.num_heads),
                        ("vision MLP width", vision.out_hidden_size),
                        ("merger width", vision.intermediate_size)):
            if n % world_size:
                problems.append(f"its {n} {what} (--mm-encoder-tp-mode weights)")
    if problems:
        raise ValueError(f"tensor_parallel_size={world_size} does not divide "
                         + ", ".join(problems))

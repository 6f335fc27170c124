"""Which rank this process is, of how many, and how the vision tower is split: what the
runner's image step needs to know of tensor parallelism."""
from __future__ import annotations

from dataclasses import dataclass

import torch

MM_ENCODER_TP_MODES = ("data", "weights")


@dataclass(frozen=True)
class ParallelLayout:
    rank: int = 0
    world_size: int = 1
    # "data": the vision tower replicated, each rank encoding a share of a step's images;
    # "weights": the tower sharded like the decoder, every rank on every image
    mm_encoder_tp_mode: str = "data"

    def image_owner(self, index: int) -> int | None:
        """The rank that encodes a step's image ``index`` and sends it to the others (None:
        every rank runs the tower on it)."""
        if self.world_size == 1 or self.mm_encoder_tp_mode == "weights":
            return None
        return index % self.world_size

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        torch.distributed.broadcast(tensor, src=src)


SINGLE = ParallelLayout()

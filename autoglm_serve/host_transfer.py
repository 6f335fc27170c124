"""Host data onto the device without stalling the step in flight.

A copy from pageable host memory synchronizes with all queued device work first; from pinned
memory it is queued like a kernel. Async scheduling depends on the latter: the next step's
inputs are copied while the current step still runs.
"""
from __future__ import annotations

import torch


def to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(data, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)

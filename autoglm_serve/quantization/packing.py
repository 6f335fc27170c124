"""Our one packed layout for sub-byte integer weights, and the unpacking of the others.

Ours (the kernel's): unsigned values (signed value + 2**(bits-1)) packed along the last dim,
32 // bits per int32, element j of a word in bits [j*bits, (j+1)*bits). For 4 and 8 bits this is
bit for bit compressed-tensors' ``pack-quantized`` layout, so its tensors load unchanged.
"""
from __future__ import annotations

import torch

# AutoAWQ's GEMM kernels read nibbles in this interleaved order: nibble i of a word holds
# column AWQ_ORDER[i] of its 8 columns.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_factor(bits: int) -> int:
    if bits not in (4, 8):
        raise ValueError(f"{bits}-bit weights are not supported (4 or 8)")
    return 32 // bits


def pack_last_dim(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., C] unsigned values (any int dtype) -> [..., C * bits / 32] int32."""
    pf = pack_factor(bits)
    if values.shape[-1] % pf:
        raise ValueError(f"last dim {values.shape[-1]} is not a multiple of {pf}")
    v = (values.to(torch.int64) & ((1 << bits) - 1)).view(*values.shape[:-1], -1, pf)
    shifts = torch.arange(pf, device=values.device, dtype=torch.int64) * bits
    words = (v << shifts).sum(-1)
    # int64 -> int32 keeps the low 32 bits: the top nibble lands in the sign bit
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_last_dim(packed: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """[..., W] int32 -> [..., W * 32 / bits] unsigned values as uint8. ``order[i]``: the
    column within its word that element i holds (AWQ's interleave); None: sequential."""
    pf = pack_factor(bits)
    shifts = torch.arange(pf, device=packed.device, dtype=torch.int32) * bits
    values = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    if order is not None:
        inverse = torch.empty(pf, dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(pf)
        values = values[..., inverse.to(packed.device)]
    return values.reshape(*packed.shape[:-1], -1).to(torch.uint8)


def unpack_first_dim(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[W, C] int32 packed along dim 0 (GPTQ's qweight) -> [W * 32 / bits, C] uint8."""
    return unpack_last_dim(packed.t(), bits).t()

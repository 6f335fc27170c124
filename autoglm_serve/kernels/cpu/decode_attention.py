"""One decode query per head against a run of a float32 CPU KV cache (decode_attention.c).

At 4,000 tokens of context a SmolLM2 decode step spent ~35 ms of its ~90 in SDPA over the
cache (30 layers, 3 KV heads of 3 query heads each): the flash kernel handles GQA by reading
each KV head once per query head. This kernel reads each key and value once for the query heads
that share it, splits the run into chunks of 256 tokens for the threads and merges them in a
fixed order. Built at first use by build.py; without it the SDPA path runs.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from autoglm_serve.kernels.cpu import build

MAX_GROUP, MAX_D = 16, 256      # as decode_attention.c


@functools.cache
def _library() -> ctypes.CDLL | None:
    library = build.load("decode_attention")
    if library is not None:
        library.decode_attention.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 5 + [
            ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        library.decode_attention.restype = ctypes.c_int
    return library


def available() -> bool:
    return _library() is not None


def supports(k: torch.Tensor, v: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether k and v ([Hkv, tokens, D] views) and q ([H, D]) are what the kernel reads:
    float32 on a CPU, each head's tokens contiguous, both with the same head stride, D a
    multiple of 8 up to MAX_D and at most MAX_GROUP query heads a KV head."""
    return (q.dtype == k.dtype == v.dtype == torch.float32 and k.device.type == "cpu"
            and k.stride()[1:] == (k.shape[2], 1) and v.stride() == k.stride()
            and q.is_contiguous() and k.shape[2] % 8 == 0 and k.shape[2] <= MAX_D
            and q.shape[0] <= MAX_GROUP * k.shape[0] and available())


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [H, D], log-sum-exp [H]) of q [H, D] against k, v [Hkv, tokens, D] (``supports``),
    H = Hkv * group; query head h reads KV head h // group."""
    hkv, tokens, d = k.shape
    heads = q.shape[0]
    out = torch.empty(heads, d, dtype=torch.float32)
    lse = torch.empty(heads, dtype=torch.float32)
    status = _library().decode_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0),
                                         hkv, heads // hkv, d, tokens, scale, out.data_ptr(),
                                         lse.data_ptr(), torch.get_num_threads())
    if status:
        raise ValueError(f"decode_attention: unsupported shape (heads {heads}, head dim {d}, "
                         f"{tokens} tokens)")
    return out, lse

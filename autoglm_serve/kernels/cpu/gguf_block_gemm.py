"""Float32 matmuls over weights kept in GGUF's Q4_1 and Q8_0 blocks (gguf_block_gemm.c).

A CPU decode step of the embedded default spent most of its time streaming float32 weights that
the GGUF file holds in 4 or 8 bits. The C kernel reads the blocks and dequantizes them in
registers, exactly as the GGUF reader rounds them, so its products are those of the loaded
float32 weights summed in one fixed order per output: a row's bits do not depend on the rows
beside it. torch's own 4-bit CPU kernel (`_weight_int4pack_mm_for_cpu`) rounds activations to
bf16 and, for float32 ones, runs a scalar loop (1,022 against 47 us at 576x576 on this AVX2 CPU).

Built at first use by build.py; without a C compiler or AVX2 it is not available and float32
linears stay on oneDNN.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from autoglm_serve.kernels.cpu import build

GROUP_SIZE = 32
Q4_1, Q8_0 = 0, 1
# bytes a block of 32 weights takes, as gguf_block_gemm.c reads it
BLOCK_BYTES = {Q4_1: 24, Q8_0: 36}


@functools.cache
def _library() -> ctypes.CDLL | None:
    library = build.load("gguf_block_gemm")
    if library is not None:
        library.gguf_block_gemm.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_void_p, ctypes.c_int]
        library.gguf_block_gemm.restype = ctypes.c_int
    return library


def available() -> bool:
    """Whether this machine can build and run the kernel (x86 with AVX2, a C compiler)."""
    return _library() is not None


def gguf_block_gemm(x: torch.Tensor, blocks: torch.Tensor, block_format: int) -> torch.Tensor:
    """x [..., K] float32 @ W^T, W [N, K] given as ``blocks`` [N, K / 32 * BLOCK_BYTES] uint8."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise TypeError(f"gguf_block_gemm takes float32 CPU activations, not {x.dtype} on "
                        f"{x.device.type}")
    k = x.shape[-1]
    n = blocks.shape[0]
    if (blocks.dtype != torch.uint8 or not blocks.is_contiguous() or k % GROUP_SIZE
            or blocks.shape[1] != k // GROUP_SIZE * BLOCK_BYTES[block_format]):
        raise ValueError(f"gguf_block_gemm: blocks {tuple(blocks.shape)} {blocks.dtype} are not "
                         f"format {block_format}'s for K={k}")
    rows = x.reshape(-1, k).contiguous()
    out = torch.empty(rows.shape[0], n, dtype=torch.float32)
    status = _library().gguf_block_gemm(block_format, rows.data_ptr(), rows.shape[0], k,
                                        blocks.data_ptr(), n, out.data_ptr(),
                                        torch.get_num_threads())
    if status:
        raise ValueError(f"gguf_block_gemm: the kernel refused K={k}, format {block_format}")
    return out.reshape(*x.shape[:-1], n)

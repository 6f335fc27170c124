"""What `quantize --int8-targets` costs on the GPU: a Linear's engine path at 8 bits against
the same Linear at 4 bits and in bf16 (GPU).

    python3 scripts/gpu/int8_linears_bench.py

At AutoGLM-Phone-9B's down_proj (4096 x 13696), o_proj (4096 x 4096) and gate_up (27392 x
4096), groups of 128 and 32 with zero points, M = 1, 4, 16, 256, 2,048 rows: the path
quantization/wna16.py takes for each (the W4A16 decode GEMV where it takes the call, else the
Triton W4A16/W8A16 kernel up to 16 rows, else the weight dequantized for cuBLAS), timed as the
GEMV benchmarks time theirs (gemv_sweep.py: CUDA graphs over enough weight copies that L2 holds
none), and the 8-bit output's relative error against dequantize-then-matmul in float32. Prints a
markdown table. Written for the forty-third session; not run there (no machine came).
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from autoglm_serve.kernels import w4a16_gemv, wna16_dequant  # noqa: E402
from autoglm_serve.kernels.wna16 import wna16_linear  # noqa: E402
from autoglm_serve.quantization.packing import pack_last_dim  # noqa: E402
from autoglm_serve.quantization.wna16 import DEQUANTIZE_ABOVE_ROWS, dequantize  # noqa: E402
from gemv_sweep import copies_past_l2, time_calls  # noqa: E402

SHAPES = {"down": (4096, 13696), "o": (4096, 4096), "gate_up": (27392, 4096)}
DTYPE = torch.bfloat16


def engine_path(x, qweight, scales, zeros, bits: int, group: int):
    """quantization/wna16.py's choice for a CUDA call (no act-order, no bias)."""
    m = x.numel() // x.shape[-1]
    if w4a16_gemv.supports(x, qweight, scales, bits, group):
        return w4a16_gemv.w4a16_gemv(x, qweight, scales, zeros, group)
    if m > DEQUANTIZE_ABOVE_ROWS:
        return F.linear(x, wna16_dequant.dequantize(qweight, scales, zeros, bits, group, x.dtype))
    return wna16_linear(x, qweight, scales, zeros, bits, group)


def main() -> None:
    torch.manual_seed(0)
    print("| shape | group | M | bf16 us | 4-bit us | 8-bit us | 8 / 4 | 8-bit rel. error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, (n, k) in SHAPES.items():
        dense = [torch.randn(n, k, device="cuda", dtype=DTYPE) * 0.02
                 for _ in range(copies_past_l2(2 * n * k))]
        for group in (128, 32):
            packed = {}
            for bits in (4, 8):
                scales = (torch.rand(n, k // group, device="cuda") * 2e-3 + 1e-4).to(DTYPE)
                zeros = torch.randint(0, 1 << bits, (n, k // group), device="cuda",
                                      dtype=torch.uint8)
                packed[bits] = [(pack_last_dim(torch.randint(0, 1 << bits, (n, k), device="cuda"),
                                               bits), scales, zeros)
                                for _ in range(copies_past_l2(n * k * bits // 8))]
            for m in (1, 4, 16, 256, 2048):
                x = torch.randn(m, k, device="cuda", dtype=DTYPE)
                codes, scales, zeros = packed[8][0]
                ref = F.linear(x.float(), dequantize(codes, scales, zeros, 8, torch.float32))
                out = engine_path(x, codes, scales, zeros, 8, group).float()
                err = ((out - ref).norm() / ref.norm()).item()
                estimate = 2 * m * n * k / 500e12 + n * k / 2e12     # seconds, for the graph size
                t16 = 1e6 * time_calls([lambda w=w: F.linear(x, w) for w in dense], estimate)
                t = {bits: 1e6 * time_calls([lambda w=w, b=bits: engine_path(x, *w, b, group)
                                             for w in packed[bits]], estimate)
                     for bits in (4, 8)}
                print(f"| {name} | {group} | {m} | {t16:.1f} | {t[4]:.1f} | {t[8]:.1f} | "
                      f"{t[8] / t[4]:.2f} | {err:.1e} |", flush=True)
            del packed
        del dense
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

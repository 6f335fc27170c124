"""What `quantize --int8-targets` costs on the GPU: a Linear's engine path at 8 bits against
the same Linear at 4 bits and in bf16 (GPU).

    python3 scripts/gpu/int8_linears_bench.py [--sweep]
    python3 scripts/gpu/int8_linears_bench.py --smoke     # CPU, Triton interpreter, tiny shapes

At AutoGLM-Phone-9B's down_proj (4096 x 13696), o_proj (4096 x 4096) and gate_up (27392 x
4096), groups of 128 and 32 with zero points, M = 1, 4, 16, 256, 2,048 rows: the path
quantization/wna16.py takes for each (``cuda_linear``: the decode GEMVs, kernels/w4a16_gemv.py
and w8a16_gemv.py, where they take the call, else the Triton W4A16/W8A16 kernel up to 16 rows,
else the weight dequantized for cuBLAS), timed as the GEMV benchmarks time theirs (gemv_sweep.py:
CUDA graphs over enough weight copies that L2 holds none), and the 8-bit output's relative error
against dequantize-then-matmul in float32. Up to 16 rows also the 8-bit Triton GEMM kernel (the
path before the 8-bit GEMV) and, with --sweep, the fastest of a few 8-bit GEMV configs (a
TUNED entry for kernels/w8a16_gemv.py; gate_up as the engine runs it, gated with SiLU-and-mul).
Prints markdown tables.
"""
from __future__ import annotations

import argparse
import os
import sys

if "--smoke" in sys.argv:        # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from autoglm_serve.kernels import w8a16_gemv  # noqa: E402
from autoglm_serve.kernels.gemv import GemvConfig  # noqa: E402
from autoglm_serve.kernels.wna16 import wna16_linear  # noqa: E402
from autoglm_serve.quantization.packing import pack_last_dim  # noqa: E402
from autoglm_serve.quantization.wna16 import cuda_linear, dequantize  # noqa: E402
from gemv_sweep import copies_past_l2, time_calls, use_interpreter_fixes  # noqa: E402

SHAPES = {"down": (4096, 13696), "o": (4096, 4096), "gate_up": (27392, 4096)}
SMOKE_SHAPES = {"down": (48, 256), "gate_up": (64, 128)}
DTYPE = torch.bfloat16


def sweep_configs(m: int, smoke: bool):
    """8-bit GEMV configs to try at m rows: CUDA cores at one row, tensor cores at more (above
    16 rows a TUNED entry is what lets the engine take the GEMV at all)."""
    configs = [GemvConfig(block_n, block_k, split_k, 4, 3, dot=m > 1)
               for block_n in (32, 64, 128) for block_k in (128, 256)
               for split_k in (1, 2, 4, 8)]
    return configs[:2] if smoke else configs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true",
                    help="8-bit GEMV configs at M <= 64, group 128")
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    args = ap.parse_args()
    smoke = args.smoke
    if smoke:
        use_interpreter_fixes()
    device = "cpu" if smoke else "cuda"
    torch.manual_seed(0)
    tuned = []
    print("| shape | group | M | bf16 us | 4-bit us | 8-bit us | 8 / 4 | 8-bit GEMM kernel us "
          "| 8-bit rel. error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, (n, k) in (SMOKE_SHAPES if smoke else SHAPES).items():
        copies = (lambda nbytes: 1) if smoke else copies_past_l2
        dense = [torch.randn(n, k, device=device, dtype=DTYPE) * 0.02
                 for _ in range(copies(2 * n * k))]
        for group in (128, 32):
            packed = {}
            for bits in (4, 8):
                scales = (torch.rand(n, k // group, device=device) * 2e-3 + 1e-4).to(DTYPE)
                zeros = torch.randint(0, 1 << bits, (n, k // group), device=device,
                                      dtype=torch.uint8)
                packed[bits] = [(pack_last_dim(torch.randint(0, 1 << bits, (n, k),
                                                             device=device), bits),
                                 scales, zeros)
                                for _ in range(copies(n * k * bits // 8))]
            for m in (1, 4, 16, 32) if smoke else (1, 4, 16, 32, 64, 256, 2048):
                x = torch.randn(m, k, device=device, dtype=DTYPE)
                codes, scales, zeros = packed[8][0]
                ref = F.linear(x.float(), dequantize(codes, scales, zeros, 8, torch.float32))
                out = cuda_linear(x, codes, scales, zeros, 8, group).float()
                err = ((out - ref).norm() / ref.norm()).item()
                estimate = 2 * m * n * k / 500e12 + n * k / 2e12     # seconds, for the graph size

                def timed(calls):
                    return 1e6 * time_calls(calls, estimate, smoke)
                t16 = timed([lambda w=w: F.linear(x, w) for w in dense])
                t = {bits: timed([lambda w=w, b=bits: cuda_linear(x, *w, b, group)
                                  for w in packed[bits]]) for bits in (4, 8)}
                old = "-"
                if m <= w8a16_gemv.MAX_ROWS:
                    old = "%.1f" % timed([lambda w=w: wna16_linear(x, *w, 8, group)
                                          for w in packed[8]])
                print(f"| {name} | {group} | {m} | {t16:.1f} | {t[4]:.1f} | {t[8]:.1f} | "
                      f"{t[8] / t[4]:.2f} | {old} | {err:.1e} |", flush=True)
                if args.sweep and group == 128 and m <= w8a16_gemv.WIDE_MAX_ROWS:
                    gated = name == "gate_up"
                    gemv = w8a16_gemv.w8a16_gated_gemv if gated else w8a16_gemv.w8a16_gemv
                    best = min((timed([lambda w=w, c=cfg: gemv(x, *w, group, config=c)
                                       for w in packed[8]]), cfg)
                               for cfg in sweep_configs(m, smoke))
                    default = timed([lambda w=w: gemv(x, *w, group) for w in packed[8]])
                    kind, rows = ("gated", n // 2) if gated else ("linear", n)
                    tuned.append(f"    ('{kind}', {m}, {rows}, {k}, {group}): "
                                 f"GemvConfig{tuple(best[1])},  # {best[0]:.1f} us, "
                                 f"default config {default:.1f}")
            del packed
        del dense
        if not smoke:
            torch.cuda.empty_cache()
    if tuned:
        print("\nw8a16_gemv.TUNED entries:")
        print("\n".join(tuned))


if __name__ == "__main__":
    main()

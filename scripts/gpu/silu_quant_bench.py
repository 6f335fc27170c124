"""down_proj's input, SiLU-and-mul quantized to e4m3: the engine's kernel by tile (GPU).

    python3 scripts/gpu/silu_quant_bench.py [--rows 16,256,4096,16384]
    python3 scripts/gpu/silu_quant_bench.py --smoke     # CPU, Triton interpreter, tiny rows

kernels/fp8_quant.silu_and_mul_quantize makes a row's scale from its amax before it can write a
code. Up to ONE_TILE_MAX columns it holds the whole row in registers and reads it once (one
tile of the next power of two, 32 warps at AutoGLM's 13,696); past that it reads [gate | up]
twice in 8,192-column tiles, the second time mostly from L2. Per row count this times the two
kernels the engine ran before (fused_ops.silu_and_mul, then fp8_quant.quantize_rows), the
engine's kernel as it dispatches, the two-pass tiles forced (8,192 columns, 16 warps) and the
one tile at 8, 16 and 32 warps, each first checked bit for bit against the two kernels.
CUDA-graph replays over inputs past L2 (scripts/gpu/gemv_sweep.py). Prints a JSON line per row
count.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if "--smoke" in sys.argv:        # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from gemv_sweep import copies_past_l2, time_calls, use_interpreter_fixes  # noqa: E402

from autoglm_serve.kernels import fp8_quant, fp8_rows, fused_ops, next_power_of_2  # noqa: E402

D = 13696            # AutoGLM-Phone-9B's intermediate size
SMOKE_D = 300


def tile(x: torch.Tensor, one_tile: bool, num_warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's kernel with its tile chosen here (one tile: the row in registers)."""
    m, d2 = x.shape
    d = d2 // 2
    q = torch.empty(m, d, dtype=fp8_rows.FP8, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    fp8_quant._silu_and_mul_quantize_kernel[(m,)](
        x, q, scale, d, x.stride(0), BLOCK=next_power_of_2(d) if one_tile else 8192,
        ONE_TILE=one_tile, PDL=False, num_warps=num_warps)
    return q, scale


def two_kernels(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return fp8_quant.quantize_rows(fused_ops.silu_and_mul(x))


def bitwise_equal(got, want) -> bool:
    return (torch.equal(got[1], want[1])
            and torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)))


def measure(m: int, d: int, smoke: bool, gen: torch.Generator) -> dict:
    copies = 1 if smoke else copies_past_l2(m * 2 * d * 2)
    xs = [torch.randn(m, 2 * d, generator=gen, device=gen.device).to(torch.bfloat16)
          for _ in range(copies)]
    want = two_kernels(xs[0])
    bytes_moved = m * d * (2 * 2 + 1)         # [gate | up] read once, the codes written
    variants = {"two_kernels": two_kernels, "engine": fp8_quant.silu_and_mul_quantize,
                "two_pass_8192x16": lambda x: tile(x, False, 16)}
    variants.update({f"one_tile_{w}w": (lambda x, w=w: tile(x, True, w)) for w in (8, 16, 32)})
    row = {"rows": m, "d": d, "one_read_us_at_4TBps": round(1e6 * bytes_moved / 4e12, 1)}
    for name, fn in variants.items():
        if not bitwise_equal(fn(xs[0]), want):
            row[name] = "WRONG"
            continue
        row[name] = round(1e6 * time_calls([lambda x=x: fn(x) for x in xs],
                                           bytes_moved / 3e12, smoke), 1)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="16,256,4096,16384")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        use_interpreter_fixes()
    gen = torch.Generator(device="cpu" if args.smoke else "cuda").manual_seed(0)
    rows = [3, 5] if args.smoke else [int(r) for r in args.rows.split(",")]
    results = [measure(m, SMOKE_D if args.smoke else D, args.smoke, gen) for m in rows]
    wrong = sum(v == "WRONG" for r in results for v in r.values())
    print(f"{wrong} variants differed from the two kernels")


if __name__ == "__main__":
    main()

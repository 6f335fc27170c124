"""FP8 GEMMs for a few hundred rows: cuBLAS's tiles against a Triton kernel's, AutoGLM's shapes.

    python3 scripts/gpu/fp8_gemm_sweep.py [--ms 64,128,256,512] [--budget-s 75]
    python3 scripts/gpu/fp8_gemm_sweep.py --smoke     # CPU, Triton interpreter, tiny shapes

Offline decode steps carry 256 rows, served ones 16-64; past the FP8 GEMV's 8 rows every
linear layer goes to ``torch._scaled_mm``. At 256 rows cuBLAS's 128 x 128 tiles give o_proj and
down 64 programs and qkv 72 on the H200's 132 SMs: half the card idles through those GEMMs. For
each shape and M this times bf16 ``F.linear``, ``_scaled_mm`` (row-wise scales, as the engine
calls it) and the same with ``use_fast_accum``, then a sweep of a Triton W8A8 GEMM written here
(not the engine's; each config first checked against ``_scaled_mm``): smaller tiles, more
programs. CUDA-graph replays over weight copies past L2, as scripts/gpu/gemv_sweep.py. Prints a
JSON line per (shape, M); past --budget-s the sweep stops trying configs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if "--smoke" in sys.argv:        # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from gemv_sweep import copies_past_l2, time_calls  # noqa: E402

from autoglm_serve.quantization.fp8 import quantize_rows, scaled_gemm  # noqa: E402

SHAPES = {"qkv": (4608, 4096), "o_proj": (4096, 4096), "gate_up": (27392, 4096),
          "down": (4096, 13696)}
SMOKE_SHAPES = {"qkv": (96, 160), "down": (64, 300)}
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
CONFIGS = [(64, 64, 128, 8, 4, 4), (64, 128, 128, 8, 4, 4), (64, 128, 128, 8, 4, 5),
           (64, 256, 128, 8, 8, 3), (128, 64, 128, 8, 4, 4), (128, 128, 128, 8, 8, 4),
           (128, 128, 128, 8, 4, 3), (128, 256, 128, 8, 8, 3), (64, 128, 256, 8, 4, 3)]
SMOKE_CONFIGS = [(32, 32, 64, 4, 4, 2), (64, 32, 128, 2, 4, 2)]


@triton.jit
def _w8a8_gemm_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """c = (a * sa) @ (b * sb)^T: a e4m3 [M, K], b e4m3 [N, K], sa [M], sb [N] float32; each
    BLOCK_K chunk's MMA added to the fp32 accumulator on its own, as cuBLAS does without
    fast accumulation. Programs walk GROUP_M row tiles per column tile (L2 reuse)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a = a_ptr + offs_m[:, None].to(tl.int64) * K + offs_k[None, :]
    b = b_ptr + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kmask = offs_k < K - k
        at = tl.load(a, mask=(offs_m[:, None] < M) & kmask[None, :], other=0.0)
        bt = tl.load(b, mask=(offs_n[None, :] < N) & kmask[:, None], other=0.0)
        acc = tl.dot(at, bt, acc, max_num_imprecise_acc=BLOCK_K)
        a += BLOCK_K
        b += BLOCK_K
    sa = tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)
    sb = tl.load(sb_ptr + offs_n, mask=offs_n < N, other=0.0)
    acc = acc * sa[:, None] * sb[None, :]
    c = c_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def w8a8_gemm(xq, x_scale, wq, w_scale, config) -> torch.Tensor:
    """xq e4m3 [M, K], x_scale float32 [M], wq e4m3 [N, K], w_scale float32 [N] -> bf16 [M, N]."""
    m, k = xq.shape
    n = wq.shape[0]
    bm, bn, bk, gm, warps, stages = config
    out = torch.empty(m, n, dtype=torch.bfloat16, device=xq.device)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _w8a8_gemm_kernel[grid](xq, wq, out, x_scale, w_scale, m, n, k, BLOCK_M=bm, BLOCK_N=bn,
                            BLOCK_K=bk, GROUP_M=gm, num_warps=warps, num_stages=stages)
    return out


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.float()
    return ((got.float() - want).norm() / want.norm()).item()


def sweep_shape(name, n, k, ms, configs, deadline, smoke) -> list[dict]:
    dev = "cpu" if smoke else "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    w16 = [torch.randn(n, k, generator=gen, device=dev).mul_(k ** -0.5).to(torch.bfloat16)
           for _ in range(1 if smoke else copies_past_l2(n * k))]
    w8 = [quantize_rows(w) for w in w16]
    rows = []
    for m in ms:
        x = torch.randn(m, k, generator=gen, device=dev).to(torch.bfloat16)
        xq, xs = quantize_rows(x)
        xs1 = xs.view(-1).contiguous()
        flop = 2 * m * n * k

        def gemm(q, s):
            return scaled_gemm(xq, xs, q, s.view(-1), None, torch.bfloat16)
        want = gemm(*w8[0])
        row = {"shape": name, "m": m, "n": n, "k": k}
        row["bf16_us"] = 1e6 * time_calls([lambda w=w: F.linear(x, w) for w in w16],
                                          flop / 600e12, smoke)
        row["scaled_mm_us"] = 1e6 * time_calls([lambda q=q, s=s: gemm(q, s) for q, s in w8],
                                               flop / 1000e12, smoke)
        if not smoke:    # fast accumulation: cuBLAS's FP8 MMA chains without fp32 promotion
            try:
                row["fast_accum_us"] = 1e6 * time_calls(
                    [lambda q=q, s=s: torch._scaled_mm(xq, q.t(), scale_a=xs,
                                                       scale_b=s.view(1, -1),
                                                       out_dtype=torch.bfloat16,
                                                       use_fast_accum=True) for q, s in w8],
                    flop / 1000e12)
            except RuntimeError as exc:
                row["fast_accum_us"] = repr(exc)[:100]
        best, wrong = None, []
        for config in configs:
            if time.monotonic() > deadline:
                row["budget_spent"] = True
                break
            got = w8a8_gemm(xq, xs1, w8[0][0], w8[0][1].view(-1).contiguous(), config)
            if not rel_err(got, want) < 1e-2:
                wrong.append(config)
                continue
            us = 1e6 * time_calls([lambda q=q, s=s: w8a8_gemm(xq, xs1, q, s.view(-1), config)
                                   for q, s in w8], flop / 1000e12, smoke)
            if best is None or us < best[0]:
                best = (us, config)
        row["triton_best_us"], row["triton_config"] = best if best else (None, None)
        row["configs_wrong"] = wrong
        for key in ("bf16_us", "scaled_mm_us", "triton_best_us"):
            if isinstance(row.get(key), float):
                row[key.replace("_us", "_tflops")] = round(flop / row[key] / 1e6, 1)
                row[key] = round(row[key], 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", default="64,128,256,512")
    ap.add_argument("--budget-s", type=float, default=75.0)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from _pytest.monkeypatch import MonkeyPatch
        from triton_interpreter_fixes import fix_interpreter
        fix_interpreter(MonkeyPatch())
        torch.set_num_threads(1)
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    configs = SMOKE_CONFIGS if args.smoke else CONFIGS
    ms = [40, 70] if args.smoke else [int(m) for m in args.ms.split(",")]
    deadline = time.monotonic() + args.budget_s
    wrong = 0
    for name, (n, k) in shapes.items():
        wrong += sum(len(r["configs_wrong"]) for r in sweep_shape(name, n, k, ms, configs,
                                                                  deadline, args.smoke))
    print(f"{wrong} configs disagreed with _scaled_mm")


if __name__ == "__main__":
    main()

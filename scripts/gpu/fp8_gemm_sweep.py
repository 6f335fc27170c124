"""FP8 GEMMs for a decode batch's rows: cuBLAS's tiles against kernels/fp8_gemm.py's split-K
tiles, AutoGLM's shapes; prints the kernel's TUNED table.

    python3 scripts/gpu/fp8_gemm_sweep.py [--ms 256,16,64,32,128,512] [--budget-s 150]
    python3 scripts/gpu/fp8_gemm_sweep.py --smoke     # CPU, Triton interpreter, tiny shapes

Offline decode steps carry 256 rows, served ones 16-64; past the FP8 GEMV's 8 rows every
linear layer went to ``torch._scaled_mm``, whose FP8 qkv and o_proj take ~13.5 us at any M up
to 256 on the H200 (their bytes need ~3.8). For each M (in the order given: the budget cuts the
last) and shape this times bf16 ``F.linear`` and ``_scaled_mm`` (row-wise scales, as the
engine calls it); at the FP8 GEMV's row counts the GEMV and the kernels the GEMM would need
around it (``gemv_path``); then the engine's split-K GEMM over tile configs (each first checked
against ``_scaled_mm``). CUDA-graph replays over weight copies past L2, as
scripts/gpu/gemv_sweep.py. A JSON line per (M, shape); at the end the TUNED entries
(``tuned_table``), and at the GEMV's row counts which way each layer should go
(``gemv_decisions``, for kernels/fp8_gemv.py's TUNED).
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
from gemv_sweep import (copies_past_l2, splits_for, time_calls,  # noqa: E402
                        use_interpreter_fixes)

from autoglm_serve.kernels import fp8_gemv, fp8_quant  # noqa: E402
from autoglm_serve.kernels import fp8_gemm as split_k_gemm  # noqa: E402
from autoglm_serve.kernels.fp8_gemm import (MIN_TILE_ROWS, GemmConfig, fp8_gemm,  # noqa: E402
                                            rows_bucket)
from autoglm_serve.quantization.fp8 import quantize_rows, scaled_gemm  # noqa: E402

SHAPES = {"qkv": (4608, 4096), "o_proj": (4096, 4096), "gate_up": (27392, 4096),
          "down": (4096, 13696)}
SMOKE_SHAPES = {"qkv": (96, 160), "gate_up": (128, 160), "down": (64, 300)}
SMOKE_CONFIGS = [GemmConfig(16, 32, 64), GemmConfig(32, 32, 64, split_k=2)]


def configs_for(m: int, n: int, k: int) -> list[GemmConfig]:
    """Activation tiles of the rows bucket and half of it (16..128), weight tiles of 64 and 128
    rows, K chunks of 128 and 256, each split-K that gives 128..1024 programs."""
    bucket = rows_bucket(m)
    configs = []
    for bm in sorted({min(bucket, 128), max(16, min(bucket, 128) // 2)}):
        for bn in (64, 128):
            for bk in (128, 256):
                tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
                for split in splits_for(tiles, triton.cdiv(k, bk)):
                    configs.append(GemmConfig(bm, bn, bk, split, 8 if bm * bn >= 128 * 128 else 4,
                                              4 if bk == 128 else 3))
    return configs


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.float()
    return ((got.float() - want).norm() / want.norm()).item()


def weights(n, k, smoke, gen):
    """(bf16 copies, (e4m3, scale) copies) of a random [n, k] weight, past L2 on the GPU."""
    w16 = [torch.randn(n, k, generator=gen, device=gen.device).mul_(k ** -0.5).to(torch.bfloat16)
           for _ in range(1 if smoke else copies_past_l2(n * k))]
    return w16, [(q, s.view(-1)) for q, s in map(quantize_rows, w16)]


def gemv_path(name, n, k, m, x, w8, smoke, gen) -> dict:
    """Where the FP8 GEMV runs (a few rows): its time (activations quantized inside; gate_up:
    the gated GEMV, SiLU-and-mul included), and the kernels the split-K GEMM would need around
    it instead: the activations' quantization, and for gate_up SiLU-and-mul's fused
    quantization of its [M, 2I] output."""
    us = {}
    if name == "gate_up":
        us["fp8_gemv_us"] = time_calls(
            [lambda q=q, s=s: fp8_gemv.fp8_gated_gemv(x, q, s) for q, s in w8], 5e-6, smoke)
        gate_up = torch.randn(m, n, generator=gen, device=gen.device).to(torch.bfloat16)
        us["silu_quantize_us"] = time_calls(
            [lambda: fp8_quant.silu_and_mul_quantize(gate_up)], 3e-6, smoke)
    else:
        us["fp8_gemv_us"] = time_calls(
            [lambda q=q, s=s: fp8_gemv.fp8_gemv(x, q, s) for q, s in w8], 5e-6, smoke)
    us["quantize_us"] = time_calls([lambda: fp8_quant.quantize_rows(x)], 3e-6, smoke)
    return {key: round(1e6 * t, 1) for key, t in us.items()}


def sweep(name, n, k, m, w16, w8, deadline, smoke, gen) -> dict:
    x = torch.randn(m, k, generator=gen, device=gen.device).to(torch.bfloat16)
    xq, xs = quantize_rows(x)
    flop = 2 * m * n * k
    want = scaled_gemm(xq, xs, *w8[0], None, torch.bfloat16)
    row = {"shape": name, "m": m, "n": n, "k": k}
    row["bf16_us"] = 1e6 * time_calls([lambda w=w: F.linear(x, w) for w in w16],
                                      flop / 600e12, smoke)
    row["scaled_mm_us"] = 1e6 * time_calls(
        [lambda q=q, s=s: scaled_gemm(xq, xs, q, s, None, torch.bfloat16) for q, s in w8],
        flop / 1000e12, smoke)
    if m <= fp8_gemv.MAX_ROWS:
        row.update(gemv_path(name, n, k, m, x, w8, smoke, gen))
    best, wrong, tried = None, [], {}
    for config in SMOKE_CONFIGS if smoke else configs_for(m, n, k):
        if time.monotonic() > deadline:
            row["budget_spent"] = True
            break
        if not rel_err(fp8_gemm(xq, xs, *w8[0], None, torch.bfloat16, config), want) < 1e-2:
            wrong.append(config)
            continue
        us = 1e6 * time_calls([lambda q=q, s=s: fp8_gemm(xq, xs, q, s, None, torch.bfloat16,
                                                         config) for q, s in w8],
                              flop / 1000e12, smoke)
        tried[str(tuple(config))] = round(us, 1)
        if best is None or us < best[0]:
            best = (us, config)
    row["split_k_best_us"], row["split_k_config"] = best if best else (None, None)
    row["configs_wrong"] = wrong
    row["tried"] = tried
    for key in ("bf16_us", "scaled_mm_us", "split_k_best_us"):
        if isinstance(row.get(key), float):
            row[key.replace("_us", "_tflops")] = round(flop / row[key] / 1e6, 1)
            row[key] = round(row[key], 1)
    print(json.dumps(row), flush=True)
    return row


def tuned_table(rows: list[dict], near: float = 0.03) -> list[str]:
    """kernels/fp8_gemm.py's TUNED lines: for each (M >= 16, shape) whose best config beats
    ``_scaled_mm`` by 3% or more, a config within ``near`` of that best, from as few distinct
    configs as a greedy cover finds (each is compiled at start-up); else None."""
    # fewer rows run the 16-row tiles: their JSON lines weigh the GEMM against the GEMV
    rows = [r for r in rows if r["m"] >= MIN_TILE_ROWS]
    near_best = {}
    for r in rows:
        best = r["split_k_best_us"]
        if best is not None and best <= 0.97 * r["scaled_mm_us"]:
            near_best[id(r)] = {c for c, us in r["tried"].items() if us <= (1 + near) * best}
    chosen, uncovered = [], set(near_best)
    while uncovered:
        pick = max(sorted(set().union(*(near_best[i] for i in uncovered))),
                   key=lambda c: sum(c in near_best[i] for i in uncovered))
        chosen.append(pick)
        uncovered = {i for i in uncovered if pick not in near_best[i]}
    lines = []
    for r in rows:
        key = (rows_bucket(r["m"]), r["n"], r["k"])
        peer = f"_scaled_mm {r['scaled_mm_us']}"
        if id(r) not in near_best:
            lines.append(f"    {key}: None,  # {r['shape']}: {r['split_k_best_us']} us, {peer}")
            continue
        pick = next(c for c in chosen if c in near_best[id(r)])
        lines.append(f"    {key}: GemmConfig{pick},  # {r['shape']}: {r['tried'][pick]} us, "
                     f"{peer}")
    return lines


def gemv_decisions(rows: list[dict]) -> list[str]:
    """kernels/fp8_gemv.py's TUNED verdicts at its row counts: None where the kernels of the
    GEMM path take less time than the GEMV, else a comment to keep it (its tile is
    scripts/gpu/quant_gemv_bench.py's to tune). What the GEMM path costs beside its GEMMs, as
    the engine runs it: qkv's and gate_up's inputs come quantized from the norm pair before
    them from two rows (kernels/fp8_rows.py), one row gets its amax alone and is quantized on
    its own; o_proj's input is always quantized on its own; down's by SiLU-and-mul's kernel
    where gate_up takes the GEMM path, on its own after the gated GEMV. The GEMM is the
    faster of the best split-K config and ``_scaled_mm``; the GEMV runs its TUNED config, or
    its default tiles where TUNED has None, so a verdict against a declined GEMV stands only
    once quant_gemv_bench.py has tuned it."""
    at = {(r["shape"], r["m"]): r for r in rows if "fp8_gemv_us" in r}

    def gemm(shape, m):
        r = at[(shape, m)]
        return min(t for t in (r["split_k_best_us"], r["scaled_mm_us"]) if t is not None)

    def line(key, verdict, why):
        return (f"    {key}: None,  # {why}" if verdict else f"    # {key}: keep the GEMV, {why}")

    lines = []
    for m in sorted({m for _, m in at}):
        for shape, norm_quantizes in (("qkv", m > 1), ("o_proj", False)):
            if (shape, m) not in at:
                continue
            r = at[(shape, m)]
            quantize = 0.0 if norm_quantizes else r["quantize_us"]
            path = round(gemm(shape, m) + quantize, 1)
            lines.append(line(fp8_gemv._tuned_key(m, r["n"], r["k"], False),
                              path < r["fp8_gemv_us"],
                              f"GEMV {r['fp8_gemv_us']}; quantize {quantize} + GEMM "
                              f"{gemm(shape, m)} = {path}"))
        if ("gate_up", m) in at and ("down", m) in at:
            up, down = at[("gate_up", m)], at[("down", m)]
            quantize = 0.0 if m > 1 else up["quantize_us"]
            gemvs = round(up["fp8_gemv_us"] + down["fp8_gemv_us"], 1)
            path = round(quantize + gemm("gate_up", m) + up["silu_quantize_us"]
                         + gemm("down", m), 1)
            why = (f"gated GEMV {up['fp8_gemv_us']} + down GEMV {down['fp8_gemv_us']} = "
                   f"{gemvs}; quantize {quantize} + GEMM {gemm('gate_up', m)} + SiLU quantize "
                   f"{up['silu_quantize_us']} + GEMM {gemm('down', m)} = {path}")
            # a declined gated GEMV leaves gate_up to the plain linear: decline that one too
            for key in (fp8_gemv._tuned_key(m, up["n"] // 2, up["k"], True),
                        fp8_gemv._tuned_key(m, up["n"], up["k"], False)):
                lines.append(line(key, path < gemvs, why))
            down_path = round(down["quantize_us"] + gemm("down", m), 1)
            down_key = fp8_gemv._tuned_key(m, down["n"], down["k"], False)
            if path < gemvs:    # down's input comes from the SiLU kernel, quantized
                lines.append(line(down_key, True, "with gate_up's GEMM path"))
            else:
                lines.append(line(down_key, down_path < down["fp8_gemv_us"],
                                  f"after the gated GEMV: GEMV {down['fp8_gemv_us']}; quantize "
                                  f"{down['quantize_us']} + GEMM {gemm('down', m)} = "
                                  f"{down_path}"))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", default="256,16,64,32,128,512")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        use_interpreter_fixes()
    # the peer is _scaled_mm as the engine calls it: scaled_gemm would otherwise take the
    # split-K GEMM where the TUNED table this sweep remakes has the shape (and the configs'
    # reference would be that kernel); the sweep calls the configs itself
    split_k_gemm.ENABLED = False
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    ms = [3, 40, 70] if args.smoke else [int(m) for m in args.ms.split(",")]
    gen = torch.Generator(device="cpu" if args.smoke else "cuda").manual_seed(0)
    prepared = {name: weights(n, k, args.smoke, gen) for name, (n, k) in shapes.items()}
    deadline = time.monotonic() + args.budget_s
    rows = [sweep(name, n, k, m, *prepared[name], deadline, args.smoke, gen)
            for m in ms for name, (n, k) in shapes.items()]
    print(f"{sum(len(r['configs_wrong']) for r in rows)} configs disagreed with _scaled_mm")
    print("TUNED = {")
    print("\n".join(tuned_table(rows)))
    print("}")
    print("kernels/fp8_gemv.py TUNED, at its row counts:")
    print("\n".join(gemv_decisions(rows)))


if __name__ == "__main__":
    main()

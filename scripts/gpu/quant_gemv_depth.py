"""One-row quantized decode GEMVs: how deep a pipeline (num_stages, warps, tile) each needs, and
what the FP8 GEMV's in-kernel activation scale costs. One GPU, AutoGLM-Phone-9B's shapes.

    python3 scripts/gpu/quant_gemv_depth.py [--budget-s 150] [--out quant_gemv_depth.json]

At one row the bf16 GEMV streams ~4.1 TB/s with 6 stages of 8 x 512 tiles (~96 KB of loads in
flight a program), where the FP8 GEMV's tuned tiles keep 3 stages of 4 KB and reach ~2.7 TB/s,
and W4A16's 3 stages of 8 KB ~1.5: quant_gemv_bench.py's sweep tried only 2-4 stages. Here,
for each shape, around each kernel's TUNED config: stages 2..10, 4 or 8 warps, and wider K
tiles; each config checked against dequantize-then-matmul first. Beside it, the FP8 GEMV
given each row's amax (``row_amax``, as the fused norm before qkv and gate_up gives it) instead
of the amax pass over x that every program makes, and a variant written here (not the
engine's) with no activation quantization at all (W8A16), to price each. Prints per shape the
TUNED time, the best found and its config, and the 40-layer step's one-row GEMMs for each.
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

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from gemv_sweep import copies_past_l2, time_calls  # noqa: E402
from quant_gemv_bench import SHAPES, rel_err, total_bytes, with_clones  # noqa: E402

from autoglm_serve.kernels import fp8_gemv, pdl, w4a16_gemv  # noqa: E402
from autoglm_serve.kernels.gemv import (GemvConfig, as_rows, finish_split_k,  # noqa: E402
                                        launch_buffers, load_k_tile, reduce_accumulators,
                                        row_tiles, split_k_range, zero_accumulators)
from autoglm_serve.kernels.pdl import wait_for_previous_grid  # noqa: E402
from autoglm_serve.quantization.kernel_checks import (fp8_reference, random_fp8,  # noqa: E402
                                                      random_w4, w4a16_reference)

LAYERS = 40
GROUP = 128


@triton.jit
def _w8a16_kernel(x_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, partial_ptr, count_ptr, M, N, K,
                  HAS_BIAS: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                  NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    """fp8_gemv's one-row CUDA-core path with x left in 16 bits (W8A16)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n, rows, offs_m, offs_k, w_gate, w_up, x_tile, m_mask = row_tiles(
        x_ptr, w_ptr, pid_n, M, N, K, 1, BLOCK_N, BLOCK_K)
    wait_for_previous_grid(PDL)
    k_start, k_end = split_k_range(pid_k, K, BLOCK_K, SPLIT_K)
    acc, acc_up = zero_accumulators(False, 1, BLOCK_N, BLOCK_K)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        x, w, w2 = load_k_tile(x_tile, w_gate, w_up, k, offs_k, m_mask, K, GATED, EVEN_K)
        xf = x.to(tl.float32)
        acc += w.to(tl.float32) * xf
        if GATED:
            acc_up += w2.to(tl.float32) * xf
    out, out_up = reduce_accumulators(acc, acc_up, False)
    out = out * tl.load(ws_ptr + rows)[:, None]
    if GATED:
        out_up = out_up * tl.load(ws_ptr + rows + N)[:, None]
    finish_split_k(y_ptr, bias_ptr, partial_ptr, count_ptr, out, out_up, rows, offs_m, offs_n,
                   pid_n, pid_k, M, N, HAS_BIAS, GATED, SPLIT_K)


def w8a16(x, weight, weight_scale, bias, gated, cfg):
    k = weight.shape[1]
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    x2 = as_rows(x, k, 1)
    y, tiles, partials, counts = launch_buffers(x, 1, n, cfg, gated)
    _w8a16_kernel[(tiles, cfg.split_k)](
        x2, weight, weight_scale, bias if bias is not None else weight_scale, y, partials,
        counts, 1, n, k, HAS_BIAS=bias is not None, GATED=gated, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, EVEN_K=k % cfg.block_k == 0,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, **pdl.launch_options(x.device))
    return y


def around(cfg: GemvConfig, kind: str) -> list[GemvConfig]:
    """The tuned config at stages 2..10 and 4 or 8 warps, and at wider K tiles or more split."""
    out = [cfg]
    for warps in (4, 8):
        for stages in (2, 3, 4, 5, 6, 8, 10):
            out.append(cfg._replace(num_warps=warps, num_stages=stages))
    if kind == "fp8":
        for bn, bk in ((8, 1024), (16, 512), (16, 1024), (4, 1024)):
            for stages in (3, 4, 6, 8):
                out.append(cfg._replace(block_n=bn, block_k=bk, num_stages=stages))
    else:
        for split in (cfg.split_k * 2, max(1, cfg.split_k // 2)):
            for stages in (4, 6, 8):
                out.append(cfg._replace(split_k=split, num_stages=stages))
        for bn in (64, 256):
            for stages in (4, 6):
                out.append(cfg._replace(block_n=bn, num_stages=stages))
    return list(dict.fromkeys(out))      # first occurrences, in order


def sweep(label, configs, call, weights, reference, nbytes, deadline, tol):
    """{config: seconds} for the configs that agree with ``reference``, until ``deadline``."""
    timed = {}
    for cfg in configs:
        if timed and time.monotonic() > deadline:
            print(f"    {label}: out of time, {len(configs) - len(timed)} configs left",
                  flush=True)
            break
        try:
            err = rel_err(call(cfg, weights[0]), reference)
            if not err < tol:
                print(f"    WRONG {label} {tuple(cfg)}: {err:.3g}", flush=True)
                continue
            timed[cfg] = time_calls([lambda w=w: call(cfg, w) for w in weights], nbytes / 3e12)
        except Exception as exc:    # out of shared memory or registers at this depth
            print(f"    {label} {tuple(cfg)}: {type(exc).__name__}: {str(exc)[:100]}",
                  flush=True)
    return timed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--out", default="quant_gemv_depth.json")
    args = ap.parse_args()
    start = time.monotonic()
    dev, dtype = "cuda", torch.bfloat16
    results = []
    sweeps = len(SHAPES) * 2
    for shape in SHAPES:
        gen = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(1, shape.k, generator=gen, device=dev).to(dtype)
        bias = (torch.randn(shape.n, generator=gen, device=dev).to(dtype) if shape.bias
                else None)
        rec = {"shape": shape.name}
        # FP8
        f8 = random_fp8(shape.rows, shape.k, dev, gen)
        nbytes = total_bytes(f8)
        f8s = with_clones(f8, copies_past_l2(nbytes))
        ref = fp8_reference(x, *f8, bias, shape.gated)
        tuned = fp8_gemv.select_config(1, shape.n, shape.k, shape.gated)

        def f8_call(cfg, w):
            if shape.gated:
                return fp8_gemv.fp8_gated_gemv(x, w[0], w[1], cfg)
            return fp8_gemv.fp8_gemv(x, w[0], w[1], bias, cfg)
        deadline = start + args.budget_s * (len(results) * 2 + 1) / sweeps
        timed = sweep(f"fp8 {shape.name}", around(tuned, "fp8"), f8_call, f8s, ref, nbytes,
                      deadline, 1e-2)
        best = min(timed, key=timed.get)
        row_amax = x.float().abs().amax(dim=-1)
        variants = {}

        def amax_given(cfg, w):
            if shape.gated:
                return fp8_gemv.fp8_gated_gemv(x, w[0], w[1], cfg, row_amax=row_amax)
            return fp8_gemv.fp8_gemv(x, w[0], w[1], bias, cfg, row_amax=row_amax)

        def w8(cfg, w):
            return w8a16(x, w[0], w[1], bias, shape.gated, cfg)
        for name, v_call, want in (("row_amax", amax_given, ref),
                                   ("w8a16", w8, _w8a16_reference(x, *f8, bias, shape.gated))):
            vt = sweep(f"fp8 {name} {shape.name}", [tuned, best], v_call, f8s, want, nbytes,
                       deadline + 30, 1e-2)
            if vt:
                cfg = min(vt, key=vt.get)
                variants[name] = {"config": list(cfg), "us": vt[cfg] * 1e6}
        rec["fp8"] = {"bytes": nbytes, "tuned": list(tuned), "tuned_us": timed[tuned] * 1e6,
                      "best": list(best), "best_us": timed[best] * 1e6, "variants": variants}
        f8s.clear()
        # W4A16
        w4 = random_w4(shape.rows, shape.k, GROUP, True, dtype, dev, gen)
        nbytes = total_bytes(w4)
        w4s = with_clones(w4, copies_past_l2(nbytes))
        ref = w4a16_reference(x, *w4, GROUP, bias, shape.gated)
        tuned = w4a16_gemv.select_config(1, shape.n, shape.k, GROUP, shape.gated)

        def w4_call(cfg, w):
            if shape.gated:
                return w4a16_gemv.w4a16_gated_gemv(x, w[0], w[1], w[2], GROUP, cfg)
            return w4a16_gemv.w4a16_gemv(x, w[0], w[1], w[2], GROUP, bias, cfg)
        deadline = start + args.budget_s * (len(results) * 2 + 2) / sweeps
        timed = sweep(f"w4a16 {shape.name}", around(tuned, "w4"), w4_call, w4s, ref, nbytes,
                      deadline, 1e-2)
        best = min(timed, key=timed.get)
        rec["w4a16"] = {"bytes": nbytes, "tuned": list(tuned), "tuned_us": timed[tuned] * 1e6,
                        "best": list(best), "best_us": timed[best] * 1e6,
                        "top": [(list(c), t * 1e6) for c, t in sorted(timed.items(),
                                                                      key=lambda kv: kv[1])[:4]]}
        w4s.clear()
        torch.cuda.empty_cache()
        for kind in ("fp8", "w4a16"):
            r = rec[kind]
            print(f"{shape.name:>13} {kind:5}: tuned {tuple(r['tuned'])} {r['tuned_us']:6.1f} us "
                  f"({r['bytes'] / r['tuned_us'] / 1e6:.2f} TB/s), best {tuple(r['best'])} "
                  f"{r['best_us']:6.1f} us ({r['bytes'] / r['best_us'] / 1e6:.2f} TB/s)",
                  flush=True)
        for name, v in rec["fp8"]["variants"].items():
            print(f"{'':>13} fp8 {name}: {v['us']:6.1f} us at {tuple(v['config'])}", flush=True)
        results.append(rec)
    for kind in ("fp8", "w4a16"):
        tuned = sum(r[kind]["tuned_us"] for r in results) * LAYERS / 1e3
        best = sum(r[kind]["best_us"] for r in results) * LAYERS / 1e3
        print(f"the 40 layers' one-row {kind} GEMMs: tuned {tuned:.3f} ms, best {best:.3f} ms")
    for name in ("row_amax", "w8a16"):
        if all(name in r["fp8"]["variants"] for r in results):
            ms = sum(r["fp8"]["variants"][name]["us"] for r in results) * LAYERS / 1e3
            print(f"the 40 layers' one-row fp8 GEMMs, {name}: {ms:.3f} ms")
    print(f"{time.monotonic() - start:.0f} s")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


def _w8a16_reference(x, weight, weight_scale, bias, gated):
    from autoglm_serve.quantization.kernel_checks import _gate
    out = x.float() @ (weight.float() * weight_scale.view(-1, 1)).t()
    if bias is not None:
        out = out + bias.float()
    return _gate(out, x.dtype) if gated else out


if __name__ == "__main__":
    main()

"""Quantized decode GEMVs (kernels/w4a16_gemv.py, kernels/fp8_gemv.py) against the paths they
replace, on one GPU, at AutoGLM-Phone-9B's decode shapes.

    python3 scripts/gpu/quant_gemv_bench.py [--out quant_gemv_bench.json] [--budget-s 170]
        [--baseline w4a16_gemv_before.py]   # a previous kernel, timed at its own table
    python3 scripts/gpu/quant_gemv_bench.py --smoke     # CPU, Triton interpreter, tiny shapes

For each linear (qkv 4608x4096 + bias, o_proj 4096x4096, gate_up 27392x4096 + SiLU-and-mul,
down 4096x13696) and M in 1, 2, 4, 8, 16, 32, 64 (--ms; the FP8 GEMV: up to 8, the W4A16 one
up to 64, where above 16 rows its peer is the engine's path there, the weight dequantized for
cuBLAS):

- bf16: cuBLAS (F.linear, + the SiLU kernel for gate_up) and the engine's bf16 GEMV (gemv.py
  with its TUNED table, gated for gate_up);
- W4A16 (group 128 with zero points, AWQ's layout): the prefill kernel kernels/wna16.py (+ SiLU),
  then a sweep of the W4A16 GEMV's configs;
- FP8 W8A8: torch._scaled_mm with the 4-op torch activation quantization (before) and with the
  fused quantization kernel (kernels/fp8_quant.py) (+ SiLU), then a sweep of the FP8 GEMV;

every config checked against dequantize-then-matmul first (WRONG lines; counted at the end).
Times are medians of CUDA-graph replays over enough weight copies (> 150 MB) that L2 holds none
of a launch's weights, as in the 40-layer step. TB/s = weight bytes (with scales, zeros) / time.
With --baseline (a copy of an earlier kernels/w4a16_gemv.py) its GEMV is checked and timed at
the config its own table selects, beside the sweep of the current one. Then a result table (one
line per shape and M), the 40-layer decode step's GEMM time per mode (4 linears a layer +
lm_head in bf16), the large-M (offline, prefill) comparison of bf16 cuBLAS, the W4A16 GEMM and
_scaled_mm with either quantization, and the two TUNED tables ready to paste. Each (shape, M,
kernel) sweep gets an equal share of what is left of --budget-s (default 170 s, compiles
included): past 75% of its share it skips its second stage (warps x stages around the best
tile), past 100% it stops (the configs it starts with are always timed: the default and the
TUNED table's, and on CUDA cores the latter in 16-bit pairs: W4A16's bf16, FP8's f16).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

if "--smoke" in sys.argv:        # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gemv_sweep import (copies_past_l2, splits_for, time_calls,  # noqa: E402
                        use_interpreter_fixes)

LAYERS = 40
DTYPE = torch.bfloat16
GROUP = 128


@dataclass(frozen=True)
class Shape:
    name: str
    n: int               # output features (gated: I, the weight has 2I rows)
    k: int
    bias: bool = False
    gated: bool = False

    @property
    def kind(self) -> str:
        return "gated" if self.gated else "linear"

    @property
    def rows(self) -> int:
        return 2 * self.n if self.gated else self.n


# largest share of the step first: a late run cuts the tuning of the last ones
SHAPES = [Shape("gate_up+silu", 13696, 4096, gated=True), Shape("down", 4096, 13696),
          Shape("qkv", 4608, 4096, bias=True), Shape("o_proj", 4096, 4096)]
SMOKE_SHAPES = [Shape("gate_up+silu", 24, 256, gated=True), Shape("qkv", 40, 320, bias=True)]
LM_HEAD = Shape("lm_head", 151552, 4096)


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-9)).item()


# ---- config grids ------------------------------------------------------------------------------

def fits(cfg, m: int, shape: Shape, kind: str) -> bool:
    """The fp32 accumulators a thread holds on CUDA cores (W4A16: one per packed word and row;
    FP8: one per weight and row) within ~64 registers, else spills."""
    if cfg.dot:
        return True
    per_row = (cfg.block_k // 8 if kind == "w4" else
               cfg.block_k // (4 * cfg.packed) if cfg.packed else cfg.block_k)
    live = cfg.block_n * per_row * m * (2 if shape.gated else 1)
    return live <= 64 * 32 * cfg.num_warps


def grid(kind: str, m: int, shape: Shape, smoke: bool):
    from autoglm_serve.kernels.gemv import GemvConfig
    if smoke:
        tiles = [(16, 128, m > 1)]
    elif m == 1:     # CUDA cores; tensor-core tiles too
        if kind == "w4":   # tiles inside a group of 128; many rows a thread (x sums shared)
            tiles = [(bn, bk, False) for bn in (256, 128, 64) for bk in (128, 64)]
        else:
            tiles = [(bn, bk, False) for bn in (8, 16) for bk in (512, 1024)] + [(32, 256, False)]
        if kind == "w4":   # tensor cores, tiles inside a group of 128
            tiles += [(bn, 128, True) for bn in (64, 128, 256)]
        else:              # native e4m3 tensor cores: wgmma wants >= 64 rows
            tiles += [(128, 256, True), (64, 256, True), (128, 128, True)]
    else:
        if kind == "w4":   # CUDA cores: ~1.4 instructions per weight plus ~1.5 per row
            tiles = [(32, 128, True), (64, 128, True), (128, 128, True), (64, 256, True)]
            tiles += [(128, 128, False), (256, 128, False)] if m == 2 else [(64, 128, False)]
        else:
            tiles = [(bn, bk, True) for bn in (128, 64) for bk in (256, 128)]
    # W4A16 on CUDA cores also in bf16 pairs, one and two words a sum (GemvConfig.packed; the
    # bench's activations are bf16): the same tiles again
    tiles = [(bn, bk, dot, 0) for bn, bk, dot in tiles]
    if kind == "w4" and m <= 2 and not smoke:
        tiles += [(bn, bk, False, words) for words in (1, 2) for bn, bk, dot, _ in tiles
                  if not dot]
    if kind == "fp8" and m == 1 and not smoke:   # FP8 in f16 pairs, two and four words a sum
        tiles += [(bn, bk, False, words) for words in (2, 4) for bn, bk, dot, _ in tiles
                  if not dot]
    out = []
    for bn, bk, dot, packed in tiles:
        chunks = math.ceil(shape.k / bk)
        for split in ([1, 2] if smoke else splits_for(math.ceil(shape.n / bn), chunks)):
            for warps in (4, 8):
                cfg = GemvConfig(bn, bk, split, num_warps=warps, num_stages=3, dot=dot,
                                 packed=packed)
                if fits(cfg, m, shape, kind):
                    out.append(cfg)
                    break       # the fewest warps that fit; stage 2 tries more
    return out


def refine(best: list, m: int, shape: Shape, kind: str) -> list:
    out = []
    for cfg in best:
        for warps in (4, 8):
            for stages in (2, 4):
                c = cfg._replace(num_warps=warps, num_stages=stages)
                if c not in out and fits(c, m, shape, kind):
                    out.append(c)
    return out


# ---- one shape ---------------------------------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.args = args
        self.device = "cpu" if args.smoke else "cuda"
        self.start = time.monotonic()
        self.failures = 0
        self.sweeps_left = 0
        self.deadline = args.budget_s
        self.baseline = None
        if args.baseline and not os.path.exists(args.baseline):
            print(f"--baseline {args.baseline}: no such file, timing without it", flush=True)
        elif args.baseline:
            self.baseline = load_module(args.baseline, "w4a16_gemv_before")

    def start_sweep(self) -> float:
        """Each sweep gets an equal share of what is left of the budget (time a sweep leaves
        unused, where its kernels were compiled already, goes to the later ones), so slow
        compiles early do not leave the last shapes untuned. Returns the sweep's start."""
        now = self.elapsed()
        self.deadline = now + max(0.0, self.args.budget_s - now) / max(1, self.sweeps_left)
        self.sweeps_left -= 1
        return now

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def copies(self, nbytes: int) -> int:
        return 1 if self.args.smoke else copies_past_l2(nbytes)

    def run_shape(self, shape: Shape) -> list[dict]:
        from autoglm_serve.kernels import fp8_gemv, fp8_quant, gemv, w4a16_gemv, wna16_dequant
        from autoglm_serve.kernels.wna16 import wna16_linear
        from autoglm_serve.models.layers.activation import SiluAndMul
        from autoglm_serve.quantization import fp8
        from autoglm_serve.quantization.kernel_checks import (fp8_reference, random_fp8,
                                                              random_w4, w4a16_reference)
        dev, args = self.device, self.args
        group = GROUP if shape.k % GROUP == 0 else 64
        gen = torch.Generator(device=dev).manual_seed(0)
        bf16_bytes = shape.rows * shape.k * 2
        w4 = random_w4(shape.rows, shape.k, group, True, DTYPE, dev, gen)
        w4_bytes = total_bytes(w4)
        w4s = with_clones(w4, self.copies(w4_bytes))
        f8 = random_fp8(shape.rows, shape.k, dev, gen)
        f8_bytes = total_bytes(f8)
        f8s = with_clones(f8, self.copies(f8_bytes))
        w16 = [(fp8_reference_weight(f8)).to(DTYPE) for _ in range(self.copies(bf16_bytes))]
        bias = (torch.randn(shape.n, generator=gen, device=dev).to(DTYPE) if shape.bias
                else None)
        silu = SiluAndMul()

        def post(y):
            return silu(y) if shape.gated else y

        records = []
        for m in args.ms:
            x = torch.randn(m, shape.k, generator=gen, device=dev).to(dev, DTYPE)
            rec = {"shape": shape.name, "m": m, "n": shape.n, "k": shape.k, "group": group,
                   "bytes": {"bf16": bf16_bytes, "w4a16": w4_bytes, "fp8": f8_bytes}}

            def base(name, fn, nbytes, weights):
                t = time_calls([lambda w=w: fn(w) for w in weights], nbytes / 3e12, args.smoke)
                rec[name] = {"us": t * 1e6, "tbs": nbytes / t / 1e12}

            base("bf16_cublas", lambda w: post(F.linear(x, w, bias)), bf16_bytes, w16)
            if m > gemv.MAX_ROWS:    # cuBLAS alone there
                rec["bf16_gemv"] = rec["bf16_cublas"]
            elif shape.gated:
                base("bf16_gemv", lambda w: gemv.gated_gemv(x, w), bf16_bytes, w16)
            else:
                base("bf16_gemv", lambda w: gemv.gemv(x, w, bias), bf16_bytes, w16)
            base("w4a16_gemm", lambda w: post(wna16_linear(x, w[0], w[1], w[2], 4, group, bias)),
                 w4_bytes, w4s)
            if m > w4a16_gemv.MAX_ROWS:    # the engine's path there, unless TUNED has the rows
                base("w4a16_dequant_cublas", lambda w: post(F.linear(
                    x, wna16_dequant.dequantize(w[0], w[1], w[2], 4, group, DTYPE), bias)),
                    w4_bytes, w4s)
            base("fp8_scaled_mm_torch_quant",
                 lambda w: post(scaled_mm(x, w, bias, fp8.quantize_rows)), f8_bytes, f8s)
            base("fp8_scaled_mm_fused_quant",
                 lambda w: post(scaled_mm(x, w, bias, fp8_quant.quantize_rows)), f8_bytes, f8s)

            def w4_call(cfg, w):
                if shape.gated:
                    return w4a16_gemv.w4a16_gated_gemv(x, w[0], w[1], w[2], group, cfg)
                return w4a16_gemv.w4a16_gemv(x, w[0], w[1], w[2], group, bias, cfg)
            old = self.baseline
            if old is not None and m <= getattr(old, "WIDE_MAX_ROWS", old.MAX_ROWS):
                rec["w4a16_gemv_before"] = self.time_baseline(x, w4s, group, bias, shape, m,
                                                              w4_bytes)
            tuned = w4a16_gemv.select_config(m, shape.n, shape.k, group, shape.gated)
            twins = [] if tuned.dot or args.smoke else [tuned._replace(packed=words)
                                                        for words in (1, 2)]
            timed = {} if m not in args.swept["w4a16"] else self.sweep_kernel(
                "w4", [w4a16_gemv.default_config(m, shape.n, shape.k, group), tuned, *twins],
                w4_call, w4s,
                w4a16_reference(x, *w4, group, bias, shape.gated), w4_bytes / 2.5e12, m, shape,
                f"w4a16 {shape.name} M={m}")
            rec["w4a16_gemv"] = ranked(timed, w4_bytes)

            def f8_call(cfg, w):
                if shape.gated:
                    return fp8_gemv.fp8_gated_gemv(x, w[0], w[1], cfg)
                return fp8_gemv.fp8_gemv(x, w[0], w[1], bias, cfg)
            tuned8 = fp8_gemv.select_config(m, shape.n, shape.k, shape.gated)
            twins8 = [] if tuned8.dot or args.smoke else [tuned8._replace(packed=words)
                                                          for words in fp8_gemv.PACKED_WORDS]
            timed = {} if m not in args.swept["fp8"] else self.sweep_kernel(
                "fp8", [fp8_gemv.default_config(m, shape.n, shape.k), tuned8, *twins8],
                f8_call, f8s,
                fp8_reference(x, *f8, bias, shape.gated), f8_bytes / 3e12, m, shape,
                f"fp8 {shape.name} M={m}")
            rec["fp8_gemv"] = ranked(timed, f8_bytes)
            print_record(rec)
            records.append(rec)
        w4s.clear(), f8s.clear(), w16.clear()
        if not args.smoke:
            torch.cuda.empty_cache()
        return records

    def time_baseline(self, x, weights, group, bias, shape, m, nbytes):
        """The W4A16 GEMV of --baseline (the kernel before a change) at its own selected config,
        checked like the sweep's; None if it disagrees or fails."""
        from autoglm_serve.quantization.kernel_checks import w4a16_reference
        old = self.baseline
        cfg = old.select_config(m, shape.n, shape.k, group, shape.gated)

        def call(w):
            if shape.gated:
                return old.w4a16_gated_gemv(x, w[0], w[1], w[2], group, cfg)
            return old.w4a16_gemv(x, w[0], w[1], w[2], group, bias, cfg)
        try:
            err = rel_err(call(weights[0]),
                          w4a16_reference(x, *weights[0], group, bias, shape.gated))
            if not err < 1e-2:
                print(f"    WRONG baseline {shape.name} M={m} {cfg}: {err:.3g}", flush=True)
                return None
            t = time_calls([lambda w=w: call(w) for w in weights], nbytes / 2e12,
                           self.args.smoke)
        except Exception as exc:
            print(f"    failed baseline {shape.name} M={m}: {type(exc).__name__}: "
                  f"{str(exc)[:160]}", flush=True)
            return None
        return {"us": t * 1e6, "tbs": nbytes / t / 1e12, "config": list(cfg)}

    def sweep_kernel(self, kind, first, call, weights, reference, est, m, shape, label):
        """Times ``call(cfg, w)`` round-robin over the weight copies, each config checked on the
        first copy against ``reference`` first. Stage 1 over the ``first`` configs (always timed),
        tile shapes and split-K; stage 2 over warps x stages for the best."""
        configs = list(dict.fromkeys(first + grid(kind, m, shape, self.args.smoke)))
        always = len(dict.fromkeys(first))

        def run(cfg):
            return [lambda w=w: call(cfg, w) for w in weights]

        def check(cfg):
            return rel_err(call(cfg, weights[0]), reference)
        timed: dict = {}
        start = self.start_sweep()
        self._measure(configs, run, check, est, label, timed, 1, always)
        stage2_from = start + 0.75 * (self.deadline - start)
        if timed and not self.args.smoke and self.elapsed() < stage2_from:
            best = sorted(timed, key=timed.get)[:1]
            self._measure(refine(best, m, shape, kind), run, check, est, label, timed, 2)
        return timed

    def _measure(self, configs, run, check, est, label, timed, stage, always=0):
        done = 0
        for cfg in configs:
            if cfg in timed:
                continue
            if (done >= max(1, always) or stage == 2) and self.elapsed() > self.deadline:
                print(f"    {label}: out of time budget, {len(configs) - done} configs skipped",
                      flush=True)
                return
            done += 1
            try:
                err = check(cfg)
                if not err < 1e-2:
                    print(f"    WRONG {label} {cfg}: relative error {err:.3g}", flush=True)
                    self.failures += 1
                    continue
                timed[cfg] = time_calls(run(cfg), est, self.args.smoke)
            except Exception as exc:   # out of resources, a compile error: skip the config
                print(f"    failed {label} {cfg}: {type(exc).__name__}: {str(exc)[:160]}",
                      flush=True)


def load_module(path: str, name: str):
    """A kernel module from a file (e.g. ``git show REV:autoglm_serve/kernels/w4a16_gemv.py``):
    Triton's jit reads its source, so it is imported from the file, not exec'd."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def total_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def with_clones(weights: tuple, copies: int) -> list[tuple]:
    """``weights`` and copies - 1 clones of its tensors: distinct memory for each launch."""
    return [weights] + [tuple(t.clone() for t in weights) for _ in range(copies - 1)]


def fp8_reference_weight(f8):
    """The bf16 weight the FP8 one dequantizes to (a realistic bf16 weight for cuBLAS)."""
    w, ws = f8
    return w.float() * ws.view(-1, 1)


def scaled_mm(x, w, bias, quantize):
    xq, xs = quantize(x)
    out = torch._scaled_mm(xq, w[0].t(), scale_a=xs, scale_b=w[1].view(1, -1), out_dtype=x.dtype)
    return out + bias if bias is not None else out


def ranked(timed: dict, nbytes: int) -> list[dict]:
    return [{"config": list(cfg), "us": t * 1e6, "tbs": nbytes / t / 1e12}
            for cfg, t in sorted(timed.items(), key=lambda kv: kv[1])[:3]]


def print_record(rec):
    def cell(name):
        v = rec[name]
        return f"{v['us']:7.1f} us {v['tbs']:.2f} TB/s"
    print(f"{rec['shape']:>13} M={rec['m']}: bf16 cuBLAS {cell('bf16_cublas')} | bf16 GEMV "
          f"{cell('bf16_gemv')}", flush=True)
    print(f"{'':>13}   W4A16 GEMM {cell('w4a16_gemm')} | FP8 _scaled_mm torch-quant "
          f"{cell('fp8_scaled_mm_torch_quant')}, fused-quant {cell('fp8_scaled_mm_fused_quant')}",
          flush=True)
    if "w4a16_dequant_cublas" in rec:
        print(f"{'':>13}   W4A16 dequantize + cuBLAS {cell('w4a16_dequant_cublas')}", flush=True)
    if rec.get("w4a16_gemv_before"):
        b = rec["w4a16_gemv_before"]
        print(f"{'':>13}   w4a16_gemv before {b['us']:7.1f} us {b['tbs']:.2f} TB/s "
              f"{tuple(b['config'])}", flush=True)
    for kind in ("w4a16_gemv", "fp8_gemv"):
        for i, e in enumerate(rec[kind]):
            print(f"{'':>13}   {kind} #{i + 1} {e['us']:7.1f} us {e['tbs']:.2f} TB/s "
                  f"{tuple(e['config'])}", flush=True)


# ---- the step, large M, the tables -------------------------------------------------------------

MODES = {
    "bf16 (engine: min cuBLAS, GEMV)": lambda r: min(r["bf16_cublas"]["us"], r["bf16_gemv"]["us"]),
    "bf16 cuBLAS": lambda r: r["bf16_cublas"]["us"],
    "W4A16 GEMM kernel (before)": lambda r: r["w4a16_gemm"]["us"],
    "W4A16 GEMV before (--baseline, its table)": lambda r: (
        min(r["w4a16_gemm"]["us"], r["w4a16_gemv_before"]["us"])
        if r.get("w4a16_gemv_before") else None),
    "W4A16 (with the table)": lambda r: min([w4_fallback(r)[1]]
                                            + [e["us"] for e in r["w4a16_gemv"][:1]]),
    "FP8 _scaled_mm + torch quant (before)": lambda r: r["fp8_scaled_mm_torch_quant"]["us"],
    "FP8 (with the table)": lambda r: min([r["fp8_scaled_mm_fused_quant"]["us"]]
                                          + [e["us"] for e in r["fp8_gemv"][:1]]),
}


def w4_fallback(r) -> tuple[str, float]:
    """(name, us) of the engine's W4A16 path where the GEMV is not taken: above MAX_ROWS rows
    the weight dequantized for cuBLAS, else the GEMM kernel (kernels/wna16.py)."""
    if "w4a16_dequant_cublas" in r:
        return "dequantize + cuBLAS", r["w4a16_dequant_cublas"]["us"]
    return "GEMM kernel", r["w4a16_gemm"]["us"]


def step_ms(records, m, key, lm_head_us) -> float | None:
    rows = [r for r in records if r["m"] == m]
    if len(rows) != len(SHAPES):
        return None
    times = [key(r) for r in rows]
    if None in times:
        return None
    return (LAYERS * sum(times) + lm_head_us) / 1e3


def time_lm_head(bench) -> dict[int, float]:
    """lm_head stays bf16: the engine's bf16 path (cuBLAS or the GEMV, the faster)."""
    from autoglm_serve.kernels import gemv
    w = [torch.randn(LM_HEAD.n, LM_HEAD.k, device="cuda", dtype=DTYPE) * 0.02 for _ in range(2)]
    out = {}
    for m in bench.args.ms:
        x = torch.randn(m, LM_HEAD.k, device="cuda", dtype=DTYPE)
        est = LM_HEAD.n * LM_HEAD.k * 2 / 3.5e12
        calls = [[lambda v=v: F.linear(x, v) for v in w]]
        if m <= gemv.MAX_ROWS:        # beyond, the engine's bf16 path is cuBLAS alone
            calls.append([lambda v=v: gemv.gemv(x, v) for v in w])
        out[m] = 1e6 * min(time_calls(c, est, False) for c in calls)
    del w
    torch.cuda.empty_cache()
    return out


def large_m(bench, shapes) -> list[dict]:
    """Offline / prefill GEMMs: bf16 cuBLAS, the W4A16 GEMM, _scaled_mm with either quant."""
    from autoglm_serve.kernels import fp8_quant
    from autoglm_serve.kernels.wna16 import wna16_linear
    from autoglm_serve.quantization import fp8
    from autoglm_serve.quantization.kernel_checks import random_fp8, random_w4
    dev = bench.device
    gen = torch.Generator(device=dev).manual_seed(1)
    out = []
    for shape in shapes:
        group = GROUP if shape.k % GROUP == 0 else 64
        w16 = torch.randn(shape.rows, shape.k, generator=gen, device=dev).to(dev, DTYPE) * 0.02
        w4 = random_w4(shape.rows, shape.k, group, True, DTYPE, dev, gen)
        f8 = random_fp8(shape.rows, shape.k, dev, gen)
        for m in bench.args.large_ms:
            x = torch.randn(m, shape.k, generator=gen, device=dev).to(dev, DTYPE)
            est = 2 * m * shape.rows * shape.k / 500e12
            rec = {"shape": shape.name, "m": m}
            for name, fn in (("bf16_cublas", lambda: F.linear(x, w16)),
                             ("w4a16_gemm", lambda: wna16_linear(x, *w4, 4, group)),
                             ("fp8_torch_quant", lambda: scaled_mm(x, f8, None, fp8.quantize_rows)),
                             ("fp8_fused_quant",
                              lambda: scaled_mm(x, f8, None, fp8_quant.quantize_rows))):
                rec[name] = time_calls([fn], est, bench.args.smoke) * 1e6
            print(f"  large M {shape.name:>13} M={m}: " + ", ".join(
                f"{k} {v:.1f} us" for k, v in rec.items() if k not in ("shape", "m")) +
                f" | FP8 fused vs bf16 {rec['bf16_cublas'] / rec['fp8_fused_quant']:.2f}x",
                flush=True)
            out.append(rec)
    return out


def result_table(records) -> str:
    """One line per (shape, M): us (TB/s of the quantized bytes; bf16: its own) per kernel."""
    def cell(v):
        return f"{v['us']:7.1f} ({v['tbs']:.2f})" if v else f"{'-':>14}"
    lines = [f"{'shape':>13} {'M':>2} | {'bf16 cuBLAS':>14} | {'W4 GEMM':>14} | "
             f"{'W4 GEMV before':>14} | {'W4 GEMV now':>14} | {'FP8 GEMV':>14} | best W4 config"]
    for r in records:
        now = r["w4a16_gemv"][0] if r["w4a16_gemv"] else None
        f8 = r["fp8_gemv"][0] if r["fp8_gemv"] else None
        lines.append(f"{r['shape']:>13} {r['m']:>2} | {cell(r['bf16_cublas'])} | "
                     f"{cell(r['w4a16_gemm'])} | {cell(r.get('w4a16_gemv_before'))} | "
                     f"{cell(now)} | {cell(f8)} | {tuple(now['config']) if now else '-'}")
    return "\n".join(lines)


def tables(records) -> str:
    from autoglm_serve.kernels.gemv import rows_bucket
    w4 = ["# paste into autoglm_serve/kernels/w4a16_gemv.py (None: the engine's other path, "
          "kernels/wna16.py or above 16 rows dequantize + cuBLAS, was faster)",
          "TUNED: dict[tuple[str, int, int, int, int], GemvConfig | None] = {"]
    f8 = ["# paste into autoglm_serve/kernels/fp8_gemv.py (None: _scaled_mm was faster)",
          "TUNED: dict[tuple[str, int, int, int], GemvConfig | None] = {"]
    for r in records:
        if rows_bucket(r["m"]) != r["m"]:
            continue
        kind = "gated" if r["shape"].startswith("gate_up") else "linear"
        if r["w4a16_gemv"]:
            best, (peer_name, peer) = r["w4a16_gemv"][0], w4_fallback(r)
            value = f"GemvConfig{tuple(best['config'])}" if best["us"] < peer else "None"
            key = (kind, r["m"], r["n"], r["k"], r["group"])
            w4.append(f"    {key!r}: {value},  # {best['us']:.1f} us, {peer_name} {peer:.1f}")
        if r["fp8_gemv"]:
            best, peer = r["fp8_gemv"][0], r["fp8_scaled_mm_fused_quant"]["us"]
            value = f"GemvConfig{tuple(best['config'])}" if best["us"] < peer else "None"
            key = (kind, r["m"], r["n"], r["k"])
            f8.append(f"    {key!r}: {value},  # {best['us']:.1f} us, _scaled_mm {peer:.1f}")
    return "\n".join(w4 + ["}", ""] + f8 + ["}"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    ap.add_argument("--out", default="quant_gemv_bench.json")
    ap.add_argument("--ms", default="1,2,4,8,16,32,64",
                    help="rows; the FP8 GEMV takes up to 8, the W4A16 one up to 64 (TUNED's "
                         "largest rows bucket)")
    ap.add_argument("--large-ms", default="256,2048")
    ap.add_argument("--shapes", default=",".join(s.name for s in SHAPES))
    ap.add_argument("--budget-s", type=float, default=170.0)
    ap.add_argument("--kernels", default="w4a16,fp8", help="the GEMVs to sweep")
    ap.add_argument("--baseline", help="a w4a16_gemv.py to time beside the current one, e.g. "
                    "from `git show REV:autoglm_serve/kernels/w4a16_gemv.py`")
    args = ap.parse_args()
    args.ms = [int(v) for v in args.ms.split(",")]
    args.large_ms = [int(v) for v in args.large_ms.split(",")]
    import triton
    if args.smoke:
        use_interpreter_fixes()
        args.ms = [1, 3, 32]
        args.large_ms = [16]
        shapes = SMOKE_SHAPES
    else:
        if not torch.cuda.is_available():
            sys.exit("needs a CUDA GPU (or --smoke)")
        print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton "
              f"{triton.__version__}", flush=True)
        shapes = [s for s in SHAPES if s.name in args.shapes.split(",")]
    from autoglm_serve.kernels import fp8_gemv, w4a16_gemv
    takes = {"w4a16": [m for m in args.ms if m <= w4a16_gemv.WIDE_MAX_ROWS],
             "fp8": [m for m in args.ms if m <= fp8_gemv.MAX_ROWS]}
    kernels = args.kernels.split(",")
    if not set(kernels) <= set(takes):
        ap.error(f"--kernels: some of {','.join(takes)}")
    args.swept = {k: ms if k in kernels else [] for k, ms in takes.items()}  # rows each sweeps
    bench = Bench(args)
    records = []
    bench.sweeps_left = len(shapes) * sum(len(ms) for ms in args.swept.values())
    for shape in shapes:
        print(f"[{bench.elapsed():5.0f} s] {shape.name} N={shape.n} K={shape.k}", flush=True)
        records += bench.run_shape(shape)

    lm_head = {m: 0.0 for m in args.ms} if args.smoke else time_lm_head(bench)
    summary = {}
    print()
    for m in args.ms:
        line = {name: step_ms(records, m, key, lm_head[m]) for name, key in MODES.items()}
        summary[m] = line
        if any(v is not None for v in line.values()):
            print(f"decode-step GEMMs at M={m} (40 layers + bf16 lm_head {lm_head[m]:.0f} us): "
                  + "; ".join(f"{k} {v:.3f} ms" for k, v in line.items() if v is not None),
                  flush=True)
    print("\n" + result_table(records), flush=True)
    big = large_m(bench, shapes)
    table = tables(records)
    print("\n" + table, flush=True)
    print(f"\n{bench.elapsed():.0f} s, {bench.failures} configs disagreed with the references",
          flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": "cpu" if args.smoke else torch.cuda.get_device_name(),
                   "records": records, "lm_head_us": lm_head, "summary": summary,
                   "large_m": big, "tables": table, "failures": bench.failures,
                   "seconds": bench.elapsed()}, f, indent=1)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()

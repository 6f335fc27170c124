"""Decode GEMV kernels (autoglm_serve/kernels/gemv.py) against cuBLAS on one GPU.

    python3 scripts/gpu/gemv_bench.py [--quick] [--out gemv_bench.json] [--ms 1,2,4,8]

AutoGLM-Phone-9B's decode GEMMs (bf16, x [M, K] @ W[N, K]^T): qkv (4608 x 4096, bias), o_proj
(4096 x 4096), gate_up (27392 x 4096; ours fused with SiLU, output 13696), down (4096 x 13696),
lm_head (151552 x 4096). For each weight and M, in this order:

- cuBLAS (F.linear; for gate_up also F.linear + the SiLU-and-mul kernel the fused GEMV removes);
- a sweep of our configs: stage 1 over tile shapes and split-K, stage 2 over num_warps x
  num_stages for the best tile shapes; each config checked against F.linear first.

Times are medians of CUDA-graph replays, each graph launching the GEMM back to back over enough
distinct weight copies (> 150 MB) that L2 (50 MB) holds none of the weights a launch reads, as
in the real 40-layer step. Bandwidth = weight bytes / time. Prints per shape cuBLAS and our best
(time, TB/s) and our top 3; then the 40-layer decode step's GEMM time at each M (4 GEMMs per
layer + lm_head); then the TUNED table in gemv.py's form. Past 80% of --budget-s (default 190 s)
stage 2 is skipped, past 100% stage 1 measures only the default config, so the whole run stays
under ~4 minutes even where compiling is slow.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autoglm_serve.kernels import gemv  # noqa: E402
from autoglm_serve.kernels.gemv import GemvConfig  # noqa: E402
from autoglm_serve.models.layers.activation import SiluAndMul  # noqa: E402
from gemv_sweep import copies_past_l2, splits_for, time_calls  # noqa: E402

DEVICE = "cuda"
DTYPE = torch.bfloat16
LAYERS = 40
MAX_SMEM = 200 << 10        # leave headroom under the 227 KB a Hopper block may use


@dataclass(frozen=True)
class Shape:
    name: str
    n: int               # output features (for gated: I, the weight has 2I rows)
    k: int
    bias: bool = False
    gated: bool = False
    per_layer: bool = True

    @property
    def kind(self) -> str:
        return "gated" if self.gated else "linear"

    @property
    def weight_rows(self) -> int:
        return 2 * self.n if self.gated else self.n

    def weight_bytes(self) -> int:
        return (self.weight_rows * self.k + (self.n if self.bias else 0)) * DTYPE.itemsize


# Largest share of the step's bytes first: a late run cuts the tuning of the last ones.
SHAPES = [Shape("gate_up+silu", 13696, 4096, gated=True), Shape("down", 4096, 13696),
          Shape("lm_head", 151552, 4096, per_layer=False), Shape("qkv", 4608, 4096, bias=True),
          Shape("o_proj", 4096, 4096)]


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# ---- the grid ----------------------------------------------------------------------------------

def smem_bytes(cfg: GemvConfig, m: int, shape: Shape) -> int:
    rows = cfg.block_n * (2 if shape.gated else 1) + (max(8, m) if cfg.dot else 1)
    return (cfg.num_stages - 1) * rows * cfg.block_k * DTYPE.itemsize


def tile_grid(m: int, shape: Shape, quick: bool) -> list[GemvConfig]:
    """Stage 1: tile shapes and split-K at 4 stages, 4 warps (8 for the largest tiles)."""
    out = []
    if m == 1:   # CUDA cores; a few tensor-core tiles too
        shapes = [(bn, bk, False) for bn in ((8, 16) if quick else (4, 8, 16, 32))
                  for bk in ((256,) if quick else (256, 512))]
        shapes += [(bn, 256, True) for bn in ((16,) if quick else (16, 64))]
    else:
        shapes = [(bn, bk, True) for bn in ((16, 64) if quick else (16, 32, 64, 128))
                  for bk in ((256,) if quick else (128, 256))]
    for bn, bk, dot in shapes:
        warps = warps_for(bn, bk, dot, shape)
        if warps is None:
            continue
        tiles = math.ceil(shape.n / bn)
        for split in splits_for(tiles, math.ceil(shape.k / bk)):
            cfg = GemvConfig(bn, bk, split, num_warps=warps, num_stages=4, dot=dot)
            if smem_bytes(cfg, m, shape) <= MAX_SMEM:
                out.append(cfg)
    return out


def warps_for(bn: int, bk: int, dot: bool, shape: Shape) -> int | None:
    """Fewest warps that keep the one-row path's [BLOCK_N, BLOCK_K] fp32 accumulators (two when
    gated) within 64 registers a thread (more spills); 8 for the largest tensor-core tiles."""
    if dot:
        return 8 if bn >= 128 else 4
    accumulators = bn * bk * (2 if shape.gated else 1)
    return next((w for w in (4, 8) if accumulators <= 64 * 32 * w), None)


def refine_grid(best: list[GemvConfig], m: int, shape: Shape) -> list[GemvConfig]:
    """Stage 2: warps x pipeline depth around the best tile shapes."""
    out = []
    for cfg in best:
        fewest = warps_for(cfg.block_n, cfg.block_k, cfg.dot, shape) or 8
        for warps in (w for w in (4, 8) if w >= fewest):
            for stages in (2, 3, 6):
                c = cfg._replace(num_warps=warps, num_stages=stages)
                if c not in out and smem_bytes(c, m, shape) <= MAX_SMEM:
                    out.append(c)
    return out


# ---- one (shape, M) ------------------------------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.args = args
        self.start = time.monotonic()
        self.failures = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def run_shape(self, shape: Shape) -> list[dict]:
        nbytes = shape.weight_bytes()
        copies = copies_past_l2(nbytes)
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        weights = [torch.randn(shape.weight_rows, shape.k, device=DEVICE, dtype=DTYPE,
                               generator=gen) * shape.k ** -0.5 for _ in range(copies)]
        bias = torch.randn(shape.n, device=DEVICE, dtype=DTYPE, generator=gen) \
            if shape.bias else None
        records = []
        for m in self.args.ms:
            x = torch.randn(m, shape.k, device=DEVICE, dtype=DTYPE, generator=gen)
            records.append(self.run_rows(shape, m, x, weights, bias))
        del weights
        torch.cuda.empty_cache()
        return records

    def run_rows(self, shape: Shape, m: int, x, weights, bias) -> dict:
        nbytes = shape.weight_bytes()
        est = nbytes / 3.5e12

        def tbs(seconds):
            return nbytes / seconds / 1e12
        cublas = time_calls([lambda w=w: F.linear(x, w, bias) for w in weights], est)
        rec = {"shape": shape.name, "m": m, "n": shape.n, "k": shape.k, "weight_bytes": nbytes,
               "cublas_us": cublas * 1e6, "cublas_tbs": tbs(cublas)}
        if shape.gated:
            silu = SiluAndMul()
            both = time_calls([lambda w=w: silu(F.linear(x, w)) for w in weights], est)
            rec.update(cublas_silu_us=both * 1e6)
        reference = gemv.reference(x, weights[0], bias, shape.gated)

        def measure(cfg: GemvConfig):
            def call(w):
                return gemv.gated_gemv(x, w, cfg) if shape.gated else gemv.gemv(x, w, bias, cfg)
            try:
                err = rel_err(call(weights[0]), reference)
                if not err < 1e-2:
                    print(f"    WRONG {cfg}: relative error {err:.3g}", flush=True)
                    self.failures += 1
                    return None
                return time_calls([lambda w=w: call(w) for w in weights], est)
            except Exception as exc:   # out of shared memory, compile error: skip the config
                print(f"    failed {cfg}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                return None

        timed: dict[GemvConfig, float] = {}

        def sweep(configs, stage, budget_s):
            t0, done = time.monotonic(), 0
            for cfg in configs:
                if (done or stage == 2) and self.elapsed() > budget_s:
                    print(f"    out of time budget: {len(configs) - done} configs skipped",
                          flush=True)
                    break
                done += 1
                if cfg not in timed:
                    t = measure(cfg)
                    if t is not None:
                        timed[cfg] = t
            print(f"    stage {stage}: {done} configs in {time.monotonic() - t0:.1f} s",
                  flush=True)

        default = gemv.default_config(m, shape.n, shape.k, DTYPE)
        sweep([default] + tile_grid(m, shape, self.args.quick), 1, self.args.budget_s)
        if not self.args.quick and timed:
            best = sorted(timed, key=timed.get)[:2]
            sweep(refine_grid(best, m, shape), 2, 0.8 * self.args.budget_s)
        ranked = sorted(timed.items(), key=lambda kv: kv[1])
        rec["default"] = {"config": default._asdict(), "us": timed.get(default, math.nan) * 1e6}
        rec["top"] = [{"config": cfg._asdict(), "us": t * 1e6, "tbs": tbs(t)}
                      for cfg, t in ranked[:3]]
        rec["configs_timed"] = len(timed)
        baseline = rec.get("cublas_silu_us", rec["cublas_us"])
        line = (f"{shape.name:>13} M={m}: cuBLAS {rec['cublas_us']:8.1f} us {rec['cublas_tbs']:.2f}"
                f" TB/s")
        if shape.gated:
            line += f" (+SiLU {rec['cublas_silu_us']:.1f} us)"
        if ranked:
            cfg, t = ranked[0]
            line += (f" | ours {t * 1e6:8.1f} us {tbs(t):.2f} TB/s, {baseline / (t * 1e6):.2f}x"
                     f" | default {rec['default']['us']:.1f} us")
        print(line, flush=True)
        for i, entry in enumerate(rec["top"]):
            print(f"      #{i + 1} {entry['us']:8.1f} us {entry['tbs']:.2f} TB/s  "
                  f"{GemvConfig(**entry['config'])}", flush=True)
        return rec


# ---- summary -----------------------------------------------------------------------------------

def step_ms(records: list[dict], m: int, key) -> float | None:
    """The 40-layer decode step's GEMMs: 4 per layer + lm_head, from per-shape microseconds."""
    total = 0.0
    for shape in SHAPES:
        rec = next((r for r in records if r["shape"] == shape.name and r["m"] == m), None)
        us = key(rec) if rec else None
        if us is None or math.isnan(us):
            return None
        total += us * (LAYERS if shape.per_layer else 1)
    return total / 1e3


def ours_us(rec):
    return rec["top"][0]["us"] if rec["top"] else None


def engine_us(rec):
    """What the engine runs with the printed table: ours, or cuBLAS where cuBLAS won."""
    baseline = rec.get("cublas_silu_us", rec["cublas_us"])
    return min(baseline, ours_us(rec) or math.inf)


def tuned_table(records: list[dict]) -> str:
    """The TUNED dict for gemv.py: our best config per (kind, rows bucket, N, K), or None where
    cuBLAS (plus the SiLU kernel, for gated) was faster."""
    lines = ["# GemvConfig(block_n, block_k, split_k, num_warps, num_stages, dot)",
             "TUNED: dict[tuple[str, int, int, int], GemvConfig | None] = {"]
    for shape in SHAPES:
        for rec in (r for r in records if r["shape"] == shape.name):
            if gemv.rows_bucket(rec["m"]) != rec["m"] or not rec["top"]:
                continue
            key = (shape.kind, rec["m"], shape.n, shape.k)
            best = rec["top"][0]
            baseline = rec.get("cublas_silu_us", rec["cublas_us"])
            cfg = GemvConfig(**best["config"])
            value = f"GemvConfig{tuple(cfg)}" if best["us"] < baseline else "None"
            peer = "cuBLAS + SiLU" if shape.gated else "cuBLAS"
            lines.append(f"    {key!r}: {value},  # {best['us']:.1f} us, {peer} {baseline:.1f}")
            if shape.gated and value == "None":   # the two-step fallback: gate_up on cuBLAS too
                lines.append(f"    {('linear', rec['m'], 2 * shape.n, shape.k)!r}: None,")
    lines.append("}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller grid, no stage 2")
    ap.add_argument("--out", default="gemv_bench.json", help="JSON results path")
    ap.add_argument("--ms", default="1,2,4,8", help="activation rows to measure")
    ap.add_argument("--shapes", default=",".join(s.name for s in SHAPES))
    ap.add_argument("--budget-s", type=float, default=190.0)
    args = ap.parse_args()
    args.ms = [int(v) for v in args.ms.split(",")]
    assert all(1 <= m <= gemv.MAX_ROWS for m in args.ms), f"M must be 1..{gemv.MAX_ROWS}"
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    import triton
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton "
          f"{triton.__version__} | {'quick' if args.quick else 'full'} grid", flush=True)

    bench = Bench(args)
    records = []
    wanted = args.shapes.split(",")
    for shape in (s for s in SHAPES if s.name in wanted):
        print(f"[{bench.elapsed():5.0f} s] {shape.name} N={shape.n} K={shape.k}"
              f"{' gated' if shape.gated else ''}{' bias' if shape.bias else ''}", flush=True)
        records += bench.run_shape(shape)

    summary = {}
    print()
    for m in args.ms:
        cublas = step_ms(records, m, lambda r: r["cublas_us"])
        cublas_silu = step_ms(records, m, lambda r: r.get("cublas_silu_us", r["cublas_us"]))
        ours = step_ms(records, m, ours_us)
        engine = step_ms(records, m, engine_us)
        summary[m] = {"cublas_ms": cublas, "cublas_with_silu_ms": cublas_silu, "ours_ms": ours,
                      "with_table_ms": engine}
        if cublas is not None and ours is not None:
            print(f"decode-step GEMMs at M={m}: cuBLAS {cublas:.3f} ms, ours {ours:.3f} ms "
                  f"(cuBLAS + the SiLU kernel ours fuses: {cublas_silu:.3f} ms; with the table "
                  f"below, cuBLAS where it wins: {engine:.3f} ms)", flush=True)
    table = tuned_table(records)
    print("\n# paste into autoglm_serve/kernels/gemv.py\n" + table, flush=True)
    print(f"\n{bench.elapsed():.0f} s, {bench.failures} configs disagreed with F.linear",
          flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "quick": args.quick, "records": records,
                   "summary": summary, "tuned_table": table, "failures": bench.failures,
                   "seconds": bench.elapsed()}, f, indent=1)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()

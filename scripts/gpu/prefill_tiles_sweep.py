"""The paged prefill kernel's tile shapes at the phone agents' chunks (GPU).

    python scripts/gpu/prefill_tiles_sweep.py [--budget-s 150] [--block-size 64 [--gather]]
    python scripts/gpu/prefill_tiles_sweep.py --smoke [--block-size 64]   # CPU, interpreter

AutoGLM-Phone-9B's attention (32 query heads, 2 KV heads, head_dim 128, bf16, pages of 16
tokens unless --block-size), one layer: chunks of the phone-agent load (a screenshot's tokens
after 1.5-8k cached tokens, a first prompt, two chunks in one step). Every PrefillTiles of the
grid below runs each case, checked against the launcher's default tiles' output, then timed
(do_bench median). Prints a markdown table, best total first: the row to copy into
PREFILL_TILES, or with pages of 64 or more on a Hopper GPU (K/V tiles as TMA boxes) into
PREFILL_TMA_TILES; --gather keeps those pages on the token-by-token loads.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]
if "--smoke" in sys.argv:        # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from gemv_sweep import use_interpreter_fixes  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from autoglm_serve.kernels.paged_prefill import (  # noqa: E402
    PREFILL_TILES, PREFILL_TMA_TILES, PrefillTiles, prefill_attention, prefill_tma_supported)
from paged_attention_cases import make_batch, rel_err  # noqa: E402

H, HKV, D = 32, 2, 128
CASES = {"1.5k+2k": [(1536, 2048)], "4k+2k": [(4096, 2048)], "8k+1k": [(8192, 1024)],
         "0+4k": [(0, 4096)], "2x(4k+1k)": [(4096, 1024)] * 2}
SMOKE_CASES = {"70+20": [(70, 20)], "2x(0+40)": [(0, 40)] * 2}     # head_dim 32


def run(batch, out, tiles: PrefillTiles | None, tma: bool | None) -> None:
    m = batch.meta
    prefill_attention(out, batch.q, batch.kv_cache, m.block_tables, m.seq_lens,
                      m.query_start_loc, batch.scale, seq_offset=0, num_seqs=m.num_seqs,
                      max_query_len=m.max_query_len, tiles=tiles, tma=tma)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--gather", action="store_true", help="no TMA boxes, whatever the pages")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    tma = False if args.gather else None
    cases = SMOKE_CASES if args.smoke else CASES
    if args.smoke:
        use_interpreter_fixes()
    start = time.monotonic()
    batches = {}
    for name, prefills in cases.items():
        b = make_batch([], prefills, num_heads=H, num_kv_heads=HKV,
                       head_dim=32 if args.smoke else D, block_size=args.block_size,
                       dtype=torch.bfloat16, device="cpu" if args.smoke else "cuda")
        b.kv_cache.normal_()
        ref = torch.empty_like(b.q)
        run(b, ref, None, tma)
        batches[name] = (b, ref)
    boxes = tma is None and prefill_tma_supported(b.kv_cache, torch.bfloat16)
    default = PREFILL_TMA_TILES if boxes else PREFILL_TILES
    print(f"pages of {args.block_size}: " + ("TMA boxes" if boxes else "gathered by token"))
    grid = [default] + [PrefillTiles(m, n, w, s) for m, n, w, s in itertools.product(
        (128, 64, 256), (64, 128, 32), (8, 4), (3, 2, 4))]
    if args.smoke:
        grid = grid[:1] + [PrefillTiles(64, 64, 4, 2)]
    rows = []
    for tiles in grid:
        if time.monotonic() - start > args.budget_s:
            print(f"budget spent: {len(rows)} of {len(grid)} configs", flush=True)
            break
        try:
            times = {}
            for name, (b, ref) in batches.items():
                out = torch.empty_like(b.q)
                run(b, out, tiles, tma)
                err = rel_err(out, ref)
                if not err < 1e-2:
                    raise RuntimeError(f"{name}: relative error {err:.1e}")
                if args.smoke:     # one wall-clock call
                    t0 = time.perf_counter()
                    run(b, out, tiles, tma)
                    times[name] = 1e3 * (time.perf_counter() - t0)
                else:
                    times[name] = 1e3 * do_bench(lambda: run(b, out, tiles, tma), warmup=5,
                                                 rep=30)
        except Exception as exc:  # out of shared memory or registers, or wrong
            print(f"{tiles}: {str(exc).splitlines()[0][:100]}", flush=True)
            continue
        rows.append((sum(times.values()), tiles, times))
        print(f"{tiles}: " + " ".join(f"{k} {v:.0f}" for k, v in times.items()), flush=True)
    rows.sort(key=lambda r: r[0])
    print("\n| tiles (block_m, block_n, warps, stages) | " + " | ".join(cases) + " | total us |")
    print("| --- |" + " --- |" * (len(cases) + 1))
    for total, tiles, times in rows[:12]:
        mark = " (current)" if tiles == default else ""
        print(f"| {tuple(tiles)}{mark} | " + " | ".join(f"{times[k]:.0f}" for k in cases)
              + f" | {total:.0f} |")
    current = next((r for r in rows if r[1] == default), None)
    if current:
        print(f"\ncurrent {tuple(default)}: {current[0]:.0f} us in total")


if __name__ == "__main__":
    main()

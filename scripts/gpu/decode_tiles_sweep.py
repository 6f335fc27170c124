"""The paged decode kernel's shape at the phone agents' and the offline batches (GPU).

    python scripts/gpu/decode_tiles_sweep.py [--budget-s 150] [--cases 1x512,1x4k]

AutoGLM-Phone-9B's attention (32 query heads, 2 KV heads, head_dim 128, bf16, block 16), one
layer, decode batches of rows x context tokens: one agent at 10k, the phone-agent issue's 16
rows at 4k and 10k, and larger batches at shorter contexts. Every DecodeTiles of the grid below
runs each case, checked against the output of the tiles decode_split picks for it
(ONE_SEQUENCE_DECODE_TILES for one, SMALL_BATCH_DECODE_TILES for two sequences, else
DECODE_TILES), then is timed as a CUDA-graph replay (the engine replays decode steps;
do_bench_cudagraph median). Each case's floor is its KV bytes over --bandwidth-tbs. Prints a
markdown table, best total first, the three current tiles marked: a row to copy if it wins
without losing a case.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import torch
from triton.testing import do_bench_cudagraph

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from autoglm_serve.kernels.paged_attention import (  # noqa: E402
    DECODE_TILES, ONE_SEQUENCE_DECODE_TILES, SMALL_BATCH_DECODE_TILES, DecodeTiles,
    decode_attention, decode_split)
from paged_attention_cases import make_batch, rel_err  # noqa: E402

H, HKV, D = 32, 2, 128
CASES = "1x10k,16x4k,16x10k,64x4k,256x1k"


def parse_case(name: str) -> tuple[int, int]:
    """'16x4k' -> (16 rows, 4,000 tokens of context)."""
    rows, context = name.split("x")
    return int(rows), int(float(context.rstrip("k")) * (1000 if context.endswith("k") else 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--bandwidth-tbs", type=float, default=4.3,
                    help="the copy bandwidth measured on the card (H200: ~4.3 TB/s)")
    ap.add_argument("--cases", default=CASES, help="rows x context, comma-separated")
    ap.add_argument("--tile-n", default="64,128,32")
    ap.add_argument("--warps", default="4,8,2")
    ap.add_argument("--stages", default="none,2,4", help="none: as shared memory allows")
    ap.add_argument("--parts-scale", default="1,0.5,0.25,2,0")
    ap.add_argument("--merge-tile", default="4", help="partial rows a merge loads at once")
    ap.add_argument("--fill-programs", default="none", help="none: the grid's width")
    ap.add_argument("--no-capped", action="store_true",
                    help="skip the current tiles capped at 5, 6, 8 and 3 programs a SM")
    args = ap.parse_args()
    cases = {name: parse_case(name) for name in args.cases.split(",")}
    start = time.monotonic()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    batches = {}
    for name, (rows, context) in cases.items():
        b = make_batch([context] * rows, [], num_heads=H, num_kv_heads=HKV, head_dim=D,
                       block_size=16, dtype=torch.bfloat16, device="cuda")
        b.kv_cache.normal_()
        m = b.meta
        split = decode_split(rows, HKV, sms)
        counters = torch.zeros(4096, dtype=torch.int32, device="cuda")
        args_ = (b.q, b.kv_cache, m.block_tables, m.seq_lens, b.scale, split, counters)
        ref = torch.empty_like(b.q)
        decode_attention(ref, *args_)
        floor_us = rows * context * HKV * 2 * D * 2 / (args.bandwidth_tbs * 1e12) * 1e6
        batches[name] = (args_, ref, floor_us)
    print("floors (us): " + " ".join(f"{k} {v[2]:.1f}" for k, v in batches.items()), flush=True)

    # partitions capped at a number of programs per SM first (the sixth session's sweep swept
    # the rest): 4 a SM took 16 x 10k from 59.3 to 49.8 us but 64 x 4k from 75.2 to 85.1
    capped = [] if args.no_capped else [DecodeTiles(64, 2, None, 1.0, programs)
                                        for programs in (5, 6, 8, 3)]
    ints = lambda text: [int(v) for v in text.split(",")]   # noqa: E731
    stages = [None if v == "none" else int(v) for v in args.stages.split(",")]
    grid = [DECODE_TILES, SMALL_BATCH_DECODE_TILES, ONE_SEQUENCE_DECODE_TILES] + capped + [
        DecodeTiles(n, w, s, p, f, m) for n, w, s, p, f, m in itertools.product(
            ints(args.tile_n), ints(args.warps), stages,
            [float(v) for v in args.parts_scale.split(",")],
            [None if v == "none" else float(v) for v in args.fill_programs.split(",")],
            ints(args.merge_tile))]
    grid = list(dict.fromkeys(grid))     # first occurrences, in order
    rows = []
    for tiles in grid:
        if time.monotonic() - start > args.budget_s:
            print(f"budget spent: {len(rows)} of {len(grid)} configs", flush=True)
            break
        try:
            times = {}
            for name, (args_, ref, _) in batches.items():
                out = torch.empty_like(ref)
                decode_attention(out, *args_, tiles=tiles)
                err = rel_err(out, ref)
                if not err < 1e-2:
                    raise RuntimeError(f"{name}: relative error {err:.1e}")
                times[name] = 1e3 * do_bench_cudagraph(
                    lambda: decode_attention(out, *args_, tiles=tiles), rep=12)
        except Exception as exc:  # out of shared memory or registers, or wrong
            print(f"{tiles}: {str(exc).splitlines()[0][:100]}", flush=True)
            continue
        rows.append((sum(times.values()), tiles, times))
        print(f"{tuple(tiles)}: " + " ".join(f"{k} {v:.1f}" for k, v in times.items()),
              flush=True)
    rows.sort(key=lambda r: r[0])
    print("\n| tiles (tile_n, warps, stages, parts_scale, fill_programs, merge_tile) | "
          + " | ".join(f"{k} us (floor {v[2]:.0f})" for k, v in batches.items())
          + " | total us |")
    print("| --- |" + " --- |" * (len(cases) + 1))
    marks = {DECODE_TILES: " (current)", SMALL_BATCH_DECODE_TILES: " (current, 2 sequences)",
             ONE_SEQUENCE_DECODE_TILES: " (current, 1 sequence)"}
    shown = rows[:12] + [r for r in rows[12:] if r[1] in marks]
    for total, tiles, times in shown:
        mark = marks.get(tiles, "")
        print(f"| {tuple(tiles)}{mark} | " + " | ".join(f"{times[k]:.1f}" for k in cases)
              + f" | {total:.1f} |")
    best16 = min(rows, key=lambda r: r[2]["16x10k"]) if rows and "16x10k" in cases else None
    if best16:
        print(f"\nbest at 16x10k: {tuple(best16[1])}: "
              + " ".join(f"{k} {v:.1f}" for k, v in best16[2].items()))


if __name__ == "__main__":
    main()

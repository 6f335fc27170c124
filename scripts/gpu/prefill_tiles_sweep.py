"""The paged prefill kernel's tile shapes at the phone agents' chunks (GPU).

    python scripts/gpu/prefill_tiles_sweep.py [--budget-s 150]

AutoGLM-Phone-9B's attention (32 query heads, 2 KV heads, head_dim 128, bf16, block 16), one
layer: chunks of the phone-agent load (a screenshot's tokens after 1.5-8k cached tokens, a
first prompt, two chunks in one step). Every PrefillTiles of the grid below runs each case,
checked against the current PREFILL_TILES' output, then timed (do_bench median). Prints a
markdown table, best total first; PREFILL_TILES is the row to copy.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import torch
from triton.testing import do_bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from autoglm_serve.kernels.paged_attention import (  # noqa: E402
    PREFILL_TILES, PrefillTiles, prefill_attention)
from paged_attention_cases import make_batch, rel_err  # noqa: E402

H, HKV, D = 32, 2, 128
CASES = {"1.5k+2k": [(1536, 2048)], "4k+2k": [(4096, 2048)], "8k+1k": [(8192, 1024)],
         "0+4k": [(0, 4096)], "2x(4k+1k)": [(4096, 1024)] * 2}


def run(batch, out, tiles: PrefillTiles) -> None:
    m = batch.meta
    prefill_attention(out, batch.q, batch.kv_cache, m.block_tables, m.seq_lens,
                      m.query_start_loc, batch.scale, seq_offset=0, num_seqs=m.num_seqs,
                      max_query_len=m.max_query_len, tiles=tiles)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=150)
    args = ap.parse_args()
    start = time.monotonic()
    batches = {}
    for name, prefills in CASES.items():
        b = make_batch([], prefills, num_heads=H, num_kv_heads=HKV, head_dim=D, block_size=16,
                       dtype=torch.bfloat16, device="cuda")
        b.kv_cache.normal_()
        ref = torch.empty_like(b.q)
        run(b, ref, PREFILL_TILES)
        batches[name] = (b, ref)
    grid = [PREFILL_TILES] + [PrefillTiles(m, n, w, s) for m, n, w, s in itertools.product(
        (128, 64, 256), (64, 128, 32), (8, 4), (3, 2, 4))]
    rows = []
    for tiles in grid:
        if time.monotonic() - start > args.budget_s:
            print(f"budget spent: {len(rows)} of {len(grid)} configs", flush=True)
            break
        try:
            times = {}
            for name, (b, ref) in batches.items():
                out = torch.empty_like(b.q)
                run(b, out, tiles)
                err = rel_err(out, ref)
                if not err < 1e-2:
                    raise RuntimeError(f"{name}: relative error {err:.1e}")
                times[name] = 1e3 * do_bench(lambda: run(b, out, tiles), warmup=5, rep=30)
        except Exception as exc:  # out of shared memory or registers, or wrong
            print(f"{tiles}: {str(exc).splitlines()[0][:100]}", flush=True)
            continue
        rows.append((sum(times.values()), tiles, times))
        print(f"{tiles}: " + " ".join(f"{k} {v:.0f}" for k, v in times.items()), flush=True)
    rows.sort(key=lambda r: r[0])
    print("\n| tiles (block_m, block_n, warps, stages) | " + " | ".join(CASES) + " | total us |")
    print("| --- |" + " --- |" * (len(CASES) + 1))
    for total, tiles, times in rows[:12]:
        mark = " (current)" if tiles == PREFILL_TILES else ""
        print(f"| {tuple(tiles)}{mark} | " + " | ".join(f"{times[k]:.0f}" for k in CASES)
              + f" | {total:.0f} |")
    current = next((r for r in rows if r[1] == PREFILL_TILES), None)
    if current:
        print(f"\ncurrent {tuple(PREFILL_TILES)}: {current[0]:.0f} us in total")


if __name__ == "__main__":
    main()

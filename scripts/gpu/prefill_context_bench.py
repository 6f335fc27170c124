"""Prefill chunks after cached context: the paged Triton kernel against SDPA on gathered K/V (GPU).

    python scripts/gpu/prefill_context_bench.py [--lengths 512,1024,2048,4096]
        [--contexts 0,2048,4096,8192,16384]

AutoGLM-Phone-9B's attention (32 query heads, 2 KV heads, head_dim 128, bf16, block 16), one
layer, one sequence: a chunk of L new tokens after C cached ones, both read from the paged cache.
Times (do_bench median) `paged_attention.prefill_attention` and `dense_prefill.attend_dense`
(gather + cuDNN, context and chunk merged by log-sum-exp), checks that the two agree, and prints
TFLOP/s of the causal attention (4 * L * (C + L/2) * H * D). Where the dense column wins from
L on is DENSE_PREFILL_MIN_TOKENS. Well under a minute on an H200.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from triton.testing import do_bench

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from autoglm_serve.kernels.paged_attention import prefill_attention  # noqa: E402
from autoglm_serve.models.layers import dense_prefill  # noqa: E402
from paged_attention_cases import make_batch, rel_err  # noqa: E402

H, HKV, D = 32, 2, 128


def one_case(context: int, length: int, seqs: int) -> dict:
    b = make_batch([], [(context, length)] * seqs, num_heads=H, num_kv_heads=HKV, head_dim=D,
                   block_size=16, dtype=torch.bfloat16, device="cuda")
    b.kv_cache.normal_()     # every slot written: both paths read the same keys
    meta = b.meta
    paged_out, dense_out = torch.empty_like(b.q), torch.empty_like(b.q)

    def paged():
        prefill_attention(paged_out, b.q, b.kv_cache, meta.block_tables, meta.seq_lens,
                          meta.query_start_loc, b.scale, seq_offset=0, num_seqs=meta.num_seqs,
                          max_query_len=meta.max_query_len)

    rows = [(i, i * length, (i + 1) * length) for i in range(seqs)]

    def dense():
        dense_prefill.attend_dense(dense_out, b.q, b.kv_cache, meta, rows, b.scale)

    paged()
    dense()
    torch.cuda.synchronize()
    err = rel_err(dense_out, paged_out)
    t_paged, t_dense = do_bench(paged), do_bench(dense)
    flops = seqs * 4.0 * length * (context + length / 2) * H * D
    return dict(context=context, length=length, seqs=seqs, paged_us=1e3 * t_paged,
                dense_us=1e3 * t_dense, paged_tflops=flops / t_paged / 1e9,
                dense_tflops=flops / t_dense / 1e9, rel_err=err)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="256,512,1024,2048,4096")
    ap.add_argument("--contexts", default="0,2048,4096,8192,16384")
    ap.add_argument("--seqs", default="1,2")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    lines = ["| seqs | cached | chunk | paged kernel us (TFLOP/s) | gather + SDPA us (TFLOP/s) "
             "| dense / paged | rel. diff |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for seqs in (int(s) for s in args.seqs.split(",")):
        for context in (int(c) for c in args.contexts.split(",")):
            for length in (int(n) for n in args.lengths.split(",")):
                r = one_case(context, length, seqs)
                lines.append(
                    f"| {seqs} | {context} | {length} | {r['paged_us']:.1f} "
                    f"({r['paged_tflops']:.0f}) | {r['dense_us']:.1f} ({r['dense_tflops']:.0f}) | "
                    f"{r['dense_us'] / r['paged_us']:.2f} | {r['rel_err']:.1e} |")
                print(lines[-1], flush=True)
    print(f"cuDNN took GQA as it is: {dense_prefill._cudnn_takes_gqa}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

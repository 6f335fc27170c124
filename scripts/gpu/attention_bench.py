"""Triton paged attention on one GPU: correctness at the model's shapes, then timings.

    python scripts/gpu/attention_bench.py [--block-size 16]

AutoGLM-Phone-9B attention (32 query heads, 2 KV heads, head_dim 128, bf16), one layer:
- decode at batch 1/64/256 x context 512/2k/8k/32k: median time of one backend step (KV write +
  split-K decode + merge) replayed from a CUDA graph, as the engine runs it, and eagerly; achieved
  bandwidth = K/V bytes read / time, against the H200's ~4.3 TB/s copy bandwidth;
- prefill of 4k tokens without and with a 4k cached prefix: TFLOP/s of the causal attention, next
  to torch SDPA (flash / cuDNN, contiguous K/V with GQA: the unpaged ceiling of the same maths).
The vision tower's attention is timed by vit_bench.py.
Prints a markdown table last. Runs in well under 3 minutes on an H200.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench, do_bench_cudagraph

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from autoglm_serve.models.layers.attention import AttentionMetadata  # noqa: E402
from autoglm_serve.models.layers.triton_attention import TritonAttentionBackend  # noqa: E402
from paged_attention_cases import check_backend, make_batch  # noqa: E402

H, HKV, D = 32, 2, 128
DTYPE = torch.bfloat16
PEAK_BW = 4.3e12          # B/s, H200 device-to-device copy as measured (DESIGN.md)
DEV = "cuda"


def paged_inputs(seq_lens: list[int], query_lens: list[int], block_size: int):
    """Dense random cache (no poison: this is for timing), scattered pages, metadata."""
    blocks = [triton.cdiv(s, block_size) for s in seq_lens]
    num_blocks = sum(blocks)
    cache = torch.randn((2, num_blocks, HKV, block_size, D), device=DEV, dtype=DTYPE)
    perm = torch.randperm(num_blocks, device=DEV, dtype=torch.int32)
    width = max(blocks)
    tables = torch.zeros((len(seq_lens), width), dtype=torch.int32, device=DEV)
    slots, used = [], 0
    for i, (s, n) in enumerate(zip(seq_lens, query_lens)):
        tables[i, :blocks[i]] = perm[used:used + blocks[i]]
        used += blocks[i]
        pos = torch.arange(s - n, s, device=DEV)
        slots.append(tables[i, pos // block_size].long() * block_size + pos % block_size)
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    t = sum(query_lens)
    meta = AttentionMetadata(
        num_seqs=len(seq_lens), num_decodes=sum(1 for n in query_lens if n == 1),
        num_tokens=t, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        query_start_loc=starts.to(DEV), seq_lens=lens.to(DEV), block_tables=tables,
        slot_mapping=torch.cat(slots), query_start_loc_cpu=starts, seq_lens_cpu=lens)
    q = torch.randn(t, H, D, device=DEV, dtype=DTYPE)
    k = torch.randn(t, HKV, D, device=DEV, dtype=DTYPE)
    v = torch.randn(t, HKV, D, device=DEV, dtype=DTYPE)
    return q, k, v, cache, meta


def check_correctness(block_size: int) -> list[str]:
    backend = TritonAttentionBackend()
    cases = {
        "decode 64 x 1..8k": ([int(x) for x in torch.randint(1, 8193, (64,))], []),
        "decode 2 x 32k": ([32768, 32768], []),
        "prefill 4k": ([], [(0, 4096)]),
        "prefill 4k + 4k prefix": ([], [(4096, 4096)]),
        "mixed 16 decodes + 3 chunks": ([int(x) for x in torch.randint(1, 4001, (16,))],
                                        [(0, 512), (1000, 700), (3000, 33)]),
    }
    lines = []
    for name, (decodes, prefills) in cases.items():
        b = make_batch(decodes, prefills, num_heads=H, num_kv_heads=HKV, head_dim=D,
                       block_size=block_size, dtype=DTYPE, device=DEV)
        try:
            err = check_backend(backend, b)
            lines.append(f"ok   {name}: rel err {err:.2e}")
        except Exception as e:  # report and go on: one GPU run should show every result
            lines.append(f"FAIL {name}: {type(e).__name__}: {e}")
        del b
        torch.cuda.empty_cache()
    return lines


def bench_decode(batch: int, ctx: int, block_size: int, backend) -> dict:
    q, k, v, cache, meta = paged_inputs([ctx] * batch, [1] * batch, block_size)
    out = torch.empty_like(q)
    scale = D ** -0.5

    def step():
        backend.forward(q, k, v, cache, meta, scale, out=out)

    eager = do_bench(step, warmup=5, rep=40, return_mode="median") * 1e-3
    graph = do_bench_cudagraph(step, rep=40, return_mode="median") * 1e-3
    kv_bytes = batch * ctx * HKV * D * 2 * cache.element_size()
    split = backend.decode_split(batch, HKV, torch.device(DEV))
    return dict(graph=graph, eager=eager, bw=kv_bytes / graph,
                parts=f"{split.partitions} (chunk >= {split.min_chunk})")


def causal_flops(query_len: int, context: int) -> float:
    visible = query_len * context + query_len * (query_len + 1) / 2
    return 4 * H * D * visible


def bench_prefill(context: int, query_len: int, block_size: int, backend) -> dict:
    q, k, v, cache, meta = paged_inputs([context + query_len], [query_len], block_size)
    out = torch.empty_like(q)
    scale = D ** -0.5
    t_triton = do_bench(lambda: backend.forward(q, k, v, cache, meta, scale, out=out),
                        warmup=5, rep=50, return_mode="median") * 1e-3
    # The peer: SDPA on contiguous [1, H, L, D] K/V, GQA, bottom-right-aligned causal mask.
    from torch.nn.attention.bias import causal_lower_right
    qs = q.transpose(0, 1).unsqueeze(0)
    ks = torch.randn(1, HKV, context + query_len, D, device=DEV, dtype=DTYPE)
    vs = torch.randn_like(ks)
    if context == 0:
        def sdpa():
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                                  enable_gqa=True)
    else:
        bias = causal_lower_right(query_len, context + query_len)
        ke, ve = ks.repeat_interleave(H // HKV, 1), vs.repeat_interleave(H // HKV, 1)

        def sdpa():
            return F.scaled_dot_product_attention(qs, ke, ve, attn_mask=bias, scale=scale)
    try:
        t_sdpa = do_bench(sdpa, warmup=5, rep=50, return_mode="median") * 1e-3
    except RuntimeError as e:  # no fused kernel for this mask on this build
        print(f"sdpa peer failed: {e}")
        t_sdpa = float("nan")
    flops = causal_flops(query_len, context)
    return dict(triton=t_triton, sdpa=t_sdpa, tflops=flops / t_triton / 1e12,
                sdpa_tflops=flops / t_sdpa / 1e12)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    bs = args.block_size
    t0 = time.time()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
          f"block_size {bs}")
    print("correctness vs TorchAttentionBackend (bf16, 32/2 heads x 128):")
    for line in check_correctness(bs):
        print("  " + line)
    print(f"  ({time.time() - t0:.0f}s)")

    backend = TritonAttentionBackend()
    rows = []

    def attempt(label: str, run) -> None:
        try:
            rows.append(run())
        except Exception as e:  # report and go on: one GPU run should show every result
            traceback.print_exc()
            rows.append(f"| {label} | FAILED: {type(e).__name__} | | | | | | |")
        torch.cuda.empty_cache()  # the last config's cache (up to 8.6 GB) is garbage now
        print(rows[-1], flush=True)

    def decode_row(batch: int, ctx: int) -> str:
        r = bench_decode(batch, ctx, bs, backend)
        return (f"| decode | {batch} | {ctx} | {r['parts']} | {r['graph'] * 1e6:.1f} | "
                f"{r['eager'] * 1e6:.1f} | {r['bw'] / 1e12:.2f} TB/s "
                f"({100 * r['bw'] / PEAK_BW:.0f}%) | |")

    def prefill_row(context: int) -> str:
        r = bench_prefill(context, 4096, bs, backend)
        return (f"| prefill 4096 | 1 | {context} + 4096 | | {r['triton'] * 1e6:.1f} | | "
                f"{r['tflops']:.0f} TFLOP/s | SDPA {r['sdpa'] * 1e6:.1f} us, "
                f"{r['sdpa_tflops']:.0f} TFLOP/s |")

    for batch in (1, 64, 256):
        for ctx in (512, 2048, 8192, 32768):
            attempt(f"decode {batch} x {ctx}", lambda: decode_row(batch, ctx))
    for context in (0, 4096):
        attempt(f"prefill {context} + 4096", lambda: prefill_row(context))

    print(f"\n(total {time.time() - t0:.0f}s)\n")
    print(f"Triton paged attention, {torch.cuda.get_device_name()}, bf16, H={H} Hkv={HKV} D={D}, "
          f"block_size={bs}; decode us = one step (KV write + attention) from a CUDA graph, "
          f"median; eager = same launched from Python.\n")
    print("| op | batch | context | split-K | us (graph / Triton) | us eager | achieved | peer |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()

"""The CPU's C kernels beside what they replace, ms (BENCHMARKS.md, CPU section):
SmolLM2-135M's 120 decoder linears (30 layers of Q4_1 blocks of its shapes, each layer its own
weights, so they stream from memory as in a step) and its LM head (Q8_0), through the GGUF block
kernel and through oneDNN over the dense float32 weights; decode attention of one query per head
at 4,000 tokens over 30 layers, through the C kernel and SDPA.

    python scripts/bench_cpu_kernels.py [--rows 1,4,16,64,256] [--repeats 5]

Threads: torch's default (every core) unless OMP_NUM_THREADS is set. Each figure is the median
of --repeats passes; the load averages are printed with it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from autoglm_serve.kernels.cpu.decode_attention import decode_attention
from autoglm_serve.kernels.cpu.gguf_block_gemm import gguf_block_gemm
from autoglm_serve.models.layers.cpu_gguf_linear import gguf_blocks
from autoglm_serve.models.layers.cpu_onednn_linear import onednn_linear, reorder_weight

LAYERS = 30
# SmolLM2-135M: qkv, o, gate_up, down ([N, K]); the LM head
LINEARS = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HEAD = (49152, 576)


def gguf_weight(ggml_type, n: int, k: int, rng) -> torch.Tensor:
    values = rng.normal(0, 0.05, (n, k)).astype(np.float32)
    return torch.from_numpy(dequantize(quantize(values, ggml_type), ggml_type).reshape(n, k).copy())


def median_ms(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,4,16,64,256")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    layers = []
    for _ in range(LAYERS):
        for n, k in LINEARS:
            weight = gguf_weight(GGMLQuantizationType.Q4_1, n, k, rng)
            fmt, blocks = gguf_blocks(weight)
            layers.append((fmt, blocks, reorder_weight(weight), k))
    head_weight = gguf_weight(GGMLQuantizationType.Q8_0, *HEAD, rng)
    head_fmt, head_blocks = gguf_blocks(head_weight)
    head_onednn = reorder_weight(head_weight)
    print(f"threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    for rows in [int(r) for r in args.rows.split(",")]:
        xs = {k: torch.randn(rows, k) for k in (576, 1536)}
        blocks_ms = median_ms(lambda: [gguf_block_gemm(xs[k], b, f) for f, b, _, k in layers],
                              args.repeats)
        onednn_ms = median_ms(lambda: [onednn_linear(xs[k], w) for _, _, w, k in layers],
                              args.repeats)
        head_ms = median_ms(lambda: gguf_block_gemm(xs[576], head_blocks, head_fmt), args.repeats)
        head_onednn_ms = median_ms(lambda: onednn_linear(xs[576], head_onednn), args.repeats)
        print(f"{rows:4d} rows: linears blocks {blocks_ms:7.1f} oneDNN {onednn_ms:7.1f} | "
              f"LM head blocks {head_ms:6.1f} oneDNN {head_onednn_ms:6.1f} | "
              f"load {os.getloadavg()[0]:.2f}")
    hkv, group, d, tokens = 3, 3, 64, 4000
    caches = [torch.randn(2, hkv, tokens, d) for _ in range(LAYERS)]
    q = torch.randn(hkv * group, d)
    ours = median_ms(lambda: [decode_attention(q, kv[0], kv[1], d ** -0.5) for kv in caches],
                     args.repeats)
    sdpa = median_ms(lambda: [F.scaled_dot_product_attention(
        q.view(1, hkv * group, 1, d), kv[0][None], kv[1][None], scale=d ** -0.5, enable_gqa=True)
        for kv in caches], args.repeats)
    print(f"decode attention, {tokens} tokens x {LAYERS} layers: C kernel {ours:.1f} SDPA "
          f"{sdpa:.1f} | load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

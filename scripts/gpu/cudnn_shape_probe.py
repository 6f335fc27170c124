"""What one attention call costs at a shape seen before and at a new one, cuDNN against flash (GPU).

    python scripts/gpu/cudnn_shape_probe.py

GQA 32/2 heads, head_dim 128, bf16: causal self-attention at lengths L, then 1,700 queries over
S keys without a mask, each call synchronised and timed alone. cuDNN builds an execution plan
for every new shape (tens of ms), flash does not: why prefill never goes to cuDNN
(models/layers/triton_attention.py). Prints one line per backend, ms a call.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def one_call(length: int, keys: int, backend: SDPBackend) -> float:
    q = torch.randn(1, 32, length, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, keys, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with sdpa_kernel([backend]):
        F.scaled_dot_product_attention(q, k, v, is_causal=length == keys, enable_gqa=True)
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start)


def main() -> None:
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        one_call(4096, 4096, backend)
        causal = [f"{n}:{one_call(n, n, backend):.1f}"
                  for n in (4096, 4097, 4100, 4096, 3001, 3002, 2048, 2049)]
        cross = [f"{n}:{one_call(1700, n, backend):.1f}" for n in (5000, 5001, 5016, 5000, 7000)]
        print(f"{backend.name}: causal, by length: {' '.join(causal)} | 1,700 queries, by "
              f"keys: {' '.join(cross)}", flush=True)


if __name__ == "__main__":
    main()

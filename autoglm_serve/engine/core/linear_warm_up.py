"""Every row count a step can give the decoder's linear layers and its LM head, run once at
start-up. cuBLAS picks a GEMM kernel by the row count, and CUDA loads a kernel's module the
first time it runs (lazy loading, CUDA's default): on an H100, a first call at a new row count
took up to 140 ms of host time, and eager prompt steps that met one launched in 60-160 ms
instead of ~37 (16 phone agents: 33 such launches in a run, none after this sweep;
BENCHMARKS.md).

The vision tower is not swept: its row counts are images' patch counts (up to ~25,600), and
a sweep of them (1.2-3.5 s at every start on an H100) would save at most the ~0.7 s that a
server's first 80 image sizes pay once (scripts/gpu/lazy_gemm_probe.py, forty-third session);
the warm-up's screenshot loads the phone agents' own."""
from __future__ import annotations

import time

import torch
from torch import nn

from autoglm_serve.engine.settings import SERVER_STEP_TOKENS
from autoglm_serve.models.layers.linear import LinearBase, dense_linear

# a server's step budget; larger (offline) steps last long enough that a load matters less
SWEPT_ROWS = SERVER_STEP_TOKENS


@torch.inference_mode()
def warm_up_linears(model: nn.Module, dtype: torch.dtype, max_rows: int,
                    max_sampled_rows: int) -> float:
    """Each distinct linear of the decoder at 1..min(max_rows, SWEPT_ROWS) rows and the LM
    head at 1..max_sampled_rows, through the layers' own methods but without tensor
    parallelism's collectives (each rank warms its own shards). Returns the seconds taken."""
    start = time.monotonic()
    decoder = getattr(model, "language_model", model)
    distinct: dict[tuple, LinearBase] = {}
    for layer in decoder.modules():
        if isinstance(layer, LinearBase):
            shapes = tuple((name, p.shape, p.dtype) for name, p in layer.named_parameters())
            distinct.setdefault((type(layer.linear_method), shapes), layer)
    rows = min(max_rows, SWEPT_ROWS)
    for layer in distinct.values():
        device = next(layer.parameters()).device
        x = torch.zeros(rows, layer.in_features, dtype=dtype, device=device)
        for m in range(1, rows + 1):
            layer.linear_method.apply(layer, x[:m], layer.bias)
    head = decoder.lm_head.weight
    hidden = torch.zeros(max_sampled_rows, head.shape[1], dtype=dtype, device=head.device)
    for m in range(1, max_sampled_rows + 1):
        dense_linear(hidden[:m], head)
    if head.device.type == "cuda":
        torch.cuda.synchronize(head.device)
    return time.monotonic() - start

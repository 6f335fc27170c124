"""One-row decode GEMVs under Nsight Compute: why the W4A16 GEMV streams ~1.8 TB/s where the
bf16 one streams ~4.1 and the FP8 one (half W4A16's weights a byte) takes about as long.

    ncu --clock-control none -k regex:'gemv|w8a16' --section ... \
        python3 scripts/gpu/gemv_ncu.py [--shapes gate_up+silu,down] [--kinds bf16,w4a16,fp8,w8a16]

Launches each kernel once at AutoGLM-Phone-9B's shapes with its TUNED config (ncu flushes the
caches before each profiled launch, so the weights come from HBM as at decode), after a first
call that compiles it; each output is checked against the reference first.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from quant_gemv_bench import SHAPES, rel_err  # noqa: E402
from quant_gemv_depth import _w8a16_reference, w8a16  # noqa: E402

from autoglm_serve.kernels import fp8_gemv, gemv, w4a16_gemv  # noqa: E402
from autoglm_serve.quantization.kernel_checks import (fp8_reference, random_fp8,  # noqa: E402
                                                      random_w4, w4a16_reference)

GROUP = 128


def calls(shape, kind, x, bias, gen):
    """(call, reference) for one kernel at one shape."""
    dev = x.device
    if kind == "bf16":
        w = (torch.randn(shape.rows, shape.k, generator=gen, device=dev) * 0.02).to(x.dtype)
        if shape.gated:
            return lambda: gemv.gated_gemv(x, w), gemv.reference(x, w, None, gated=True)
        return lambda: gemv.gemv(x, w, bias), gemv.reference(x, w, bias)
    if kind == "w4a16":
        q, s, z = random_w4(shape.rows, shape.k, GROUP, True, x.dtype, dev, gen)
        ref = w4a16_reference(x, q, s, z, GROUP, bias, shape.gated)
        if shape.gated:
            return lambda: w4a16_gemv.w4a16_gated_gemv(x, q, s, z, GROUP), ref
        return lambda: w4a16_gemv.w4a16_gemv(x, q, s, z, GROUP, bias), ref
    w, ws = random_fp8(shape.rows, shape.k, dev, gen)
    if kind == "w8a16":
        cfg = fp8_gemv.select_config(1, shape.n, shape.k, shape.gated)
        return (lambda: w8a16(x, w, ws, bias, shape.gated, cfg),
                _w8a16_reference(x, w, ws, bias, shape.gated))
    amax = x.float().abs().amax(dim=-1)   # as the fused norm gives it
    ref = fp8_reference(x, w, ws, bias, shape.gated)
    if shape.gated:
        return lambda: fp8_gemv.fp8_gated_gemv(x, w, ws, row_amax=amax), ref
    return lambda: fp8_gemv.fp8_gemv(x, w, ws, bias, row_amax=amax), ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(s.name for s in SHAPES))
    ap.add_argument("--kinds", default="bf16,w4a16,fp8,w8a16")
    args = ap.parse_args()
    names = args.shapes.split(",")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in (s for s in SHAPES if s.name in names):
        x = torch.randn(1, shape.k, generator=gen, device="cuda").to(torch.bfloat16)
        bias = (torch.randn(shape.n, generator=gen, device="cuda").to(torch.bfloat16)
                if shape.bias else None)
        for kind in args.kinds.split(","):
            call, ref = calls(shape, kind, x, bias, gen)
            err = rel_err(call(), ref)
            assert err < 1e-2, f"{kind} {shape.name}: {err}"
            torch.cuda.synchronize()
            call()                       # the profiled launch
            torch.cuda.synchronize()
            print(f"{shape.name} {kind}: rel. err. {err:.1e}", flush=True)


if __name__ == "__main__":
    main()

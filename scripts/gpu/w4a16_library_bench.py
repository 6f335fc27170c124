"""Our W4A16 decode GEMV against the maintained libraries' int4 kernels, at AutoGLM-Phone-9B's
decode shapes, one row by default (GPU; issue 12 asks for the faster of ours and a library).

    python3 scripts/gpu/w4a16_library_bench.py [--rows 1] [--out w4a16_library_bench.json]

Group 128 with zero points (AWQ's and compressed-tensors' asymmetric int4). Beside ours
(kernels/w4a16_gemv.py at its TUNED config): GemLite's Triton kernels (``gemlite``, as vLLM's
plugin uses them; its H100 config table, the closest it ships to an H200) and torch's own
CUDA int4 kernel (``torch._weight_int4pack_mm``, the tinygemm kernel torchao and gpt-fast
use), both fed the same integers. Each is checked against dequantize-then-matmul first (rel. err
<= 1e-2) and timed as in quant_gemv_bench.py: medians of CUDA-graph replays over weight copies
past L2. gate_up is timed as its GEMV alone for the libraries (ours fuses SiLU-and-mul in
the same time). Prints a table and the 40 layers' one-row sum per kernel.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from gemv_sweep import copies_past_l2, time_calls  # noqa: E402

from autoglm_serve.kernels import w4a16_gemv  # noqa: E402
from autoglm_serve.quantization.kernel_checks import random_w4, w4a16_reference  # noqa: E402
from autoglm_serve.quantization.packing import unpack_last_dim  # noqa: E402

GROUP = 128
LAYERS = 40
SHAPES = (("qkv", 4608, 4096, True, False), ("o_proj", 4096, 4096, False, False),
          ("gate_up", 27392, 4096, False, True), ("down", 4096, 13696, False, False))


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def gemlite_layer(q, scales, zeros, bias, n, k):
    import gemlite
    layer = gemlite.GemLiteLinearTriton(4, GROUP, k, n, gemlite.DType.BF16, gemlite.DType.BF16)
    # (W_q - zeros) * scales: the same arithmetic as our reference (fma_mode folds -z*s into
    # one bf16 number instead)
    layer.pack(q.to(torch.uint8), scales, zeros.to(scales.dtype), bias, fma_mode=False)
    return layer


def tinygemm_weights(q, scales, zeros, inner_k_tiles):
    """torch's int4 layout: w = (q - 8) * scale + zero, so zero = scale * (8 - z) (bf16)."""
    packed = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
    w = torch._convert_weight_to_int4pack(packed, inner_k_tiles)
    s = scales.float()
    sz = torch.stack([s, s * (8 - zeros.float())], dim=-1)      # [N, K/g, 2]
    return w, sz.transpose(0, 1).contiguous().to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                  "w4a16_library_bench.json"))
    args = ap.parse_args()
    import gemlite
    from gemlite.core import get_matmul_type
    h100 = os.path.join(os.path.dirname(gemlite.__file__), "configs", "h100.json")
    print("gemlite", gemlite.__version__, "config", h100, gemlite.load_config(h100), flush=True)
    start = time.monotonic()
    dev, dtype = "cuda", torch.bfloat16
    records = []
    for name, n, k, has_bias, gated in SHAPES:
        gen = torch.Generator(device=dev).manual_seed(0)
        qweight, scales, zeros = random_w4(n, k, GROUP, True, dtype, dev, gen)
        bias = torch.randn(n, generator=gen, device=dev).to(dtype) if has_bias else None
        q = unpack_last_dim(qweight, 4).to(torch.int32)
        nbytes = qweight.numel() * 4 + scales.numel() * 2 + zeros.numel()
        copies = max(3, copies_past_l2(nbytes))
        ours_w = [(qweight.clone(), scales.clone(), zeros.clone()) for _ in range(copies)]
        try:
            gl = [gemlite_layer(q, scales, zeros, bias, n, k) for _ in range(copies)]
        except Exception as exc:
            print(f"{name}: gemlite could not pack: {exc!r}", flush=True)
            gl = []
        tg = {t: [tinygemm_weights(q, scales, zeros, t) for _ in range(copies)]
              for t in (2, 4, 8)}
        for m in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(m, k, generator=gen, device=dev).to(dtype)
            ref = w4a16_reference(x, qweight, scales, zeros, GROUP, bias, False)
            cfg = w4a16_gemv.select_config(m, n // 2 if gated else n, k, GROUP, gated)
            rec = {"shape": name, "n": n, "k": k, "rows": m, "bytes": nbytes}

            def ours(w, x=x, cfg=cfg):
                if gated:
                    return w4a16_gemv.w4a16_gated_gemv(x, w[0], w[1], w[2], GROUP, cfg)
                return w4a16_gemv.w4a16_gemv(x, w[0], w[1], w[2], GROUP, bias, cfg)
            calls = {"ours": [lambda w=w, ours=ours: ours(w) for w in ours_w]}
            checks = {"ours": ours(ours_w[0])}
            refs = {"ours": w4a16_reference(x, qweight, scales, zeros, GROUP, bias, gated)}
            # gemlite autotunes each kernel at its first call (~20 configs): the ones it picks
            # for these rows only
            for kind in (("GEMV_REVSPLITK", "GEMV") if m == 1 else ("GEMM_SPLITK",)):
                if not gl:
                    break
                try:
                    checks[f"gemlite {kind}"] = gl[0].forward_manual(x, kind)
                    calls[f"gemlite {kind}"] = [lambda layer=layer, kind=kind:
                                                layer.forward_manual(x, kind) for layer in gl]
                except Exception as exc:     # a kernel gemlite does not offer at this shape
                    rec[f"gemlite {kind}"] = f"error: {exc!r}"[:200]
            rec["gemlite auto"] = get_matmul_type(m, 4)
            for t, ws in tg.items():
                def tiny(w, x=x):
                    y = torch._weight_int4pack_mm(x, w[0], GROUP, w[1])
                    return y + bias if bias is not None else y
                try:
                    checks[f"torch int4pack t{t}"] = tiny(ws[0])
                    calls[f"torch int4pack t{t}"] = [lambda w=w, tiny=tiny: tiny(w) for w in ws]
                except Exception as exc:
                    rec[f"torch int4pack t{t}"] = f"error: {exc!r}"[:200]
            for label, out in checks.items():
                err = rel_err(out, refs.get(label, ref))
                if not err <= 1e-2:
                    rec[label] = f"WRONG (rel err {err:.2e})"
                    continue
                try:
                    us = time_calls(calls[label], 20e-6) * 1e6
                except Exception as exc:
                    rec[label] = f"error timing: {exc!r}"[:200]
                    continue
                rec[label] = {"us": round(us, 2), "tb_s": round(nbytes / us / 1e6, 2),
                              "rel_err": float(f"{err:.2e}")}
            line = "  ".join(f"{lab}: {v['us']:.1f}" if isinstance(v, dict) else f"{lab}: {v}"
                             for lab, v in rec.items()
                             if lab not in ("shape", "n", "k", "rows", "bytes"))
            print(f"{name:>8} m={m}  {line}", flush=True)
            records.append(rec)
        del ours_w, gl, tg
        torch.cuda.empty_cache()
    for m in sorted({r["rows"] for r in records}):
        labels = {lab for r in records if r["rows"] == m for lab, v in r.items()
                  if isinstance(v, dict)}
        for lab in sorted(labels):
            recs = [r for r in records if r["rows"] == m]
            if all(isinstance(r.get(lab), dict) for r in recs):
                ms = sum(r[lab]["us"] for r in recs) * LAYERS / 1e3
                print(f"rows {m}: the 40 layers, {lab}: {ms:.3f} ms")
    print(f"{time.monotonic() - start:.0f} s")
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()

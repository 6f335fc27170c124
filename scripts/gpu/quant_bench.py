"""Quantized AutoGLM-Phone-9B on one GPU, each beside bf16 in the same run:

    python scripts/gpu/quant_bench.py                # H200: about 3-4 minutes
    python scripts/gpu/quant_bench.py --smoke        # CPU, tiny GLM-4.1V, every code path

(a) kernels against the dequantize-then-matmul reference at the real shapes (qkv 4608x4096,
    o 4096x4096, gate_up 27392x4096, down 4096x13696): W4A16 g128 with zero points (the AWQ /
    GPTQ layout after conversion), W4A16 symmetric (compressed-tensors), W8A16, FP8 W8A8;
    max abs and relative error;
(b) each kernel's time against bf16 F.linear at M = 1, 16, 256, 4096 (CUDA graphs of 20
    launches, so launch overhead is not what is measured), and the weight GB/s it implies;
(c) the engine with --load-format dummy for bf16, W4A16 (compressed-tensors g128) and FP8, each
    in its own subprocess (a clean GPU): single stream (512 in, 256 out; decode tok/s), offline
    throughput (256 requests of 512 in / 128 out; output tok/s) and the weights in GiB (all and
    the text decoder's linear layers alone), and the KV cache's tokens. ``--modes`` adds
    w4a16_fp8kv (--kv-cache-dtype fp8), fp8_vit (--mm-encoder-quantization fp8), and gptq_w4
    / gptq_int8_down: GPTQ's layout (g128, zero points), all 4-bit or with every down_proj at
    8 bits as `quantize --int8-targets down_proj` writes it (--hf-overrides gives the dummy
    model that quantization_config).
Raw numbers go to $OUT/quant_bench.json when $OUT is set; a markdown table is printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), HERE]

# mode -> LLM settings; the default run is the first three (--modes adds the others)
MODES = {"bf16": {}, "w4a16": {"quantization": "compressed-tensors"},
         "fp8": {"quantization": "fp8"},
         "w4a16_fp8kv": {"quantization": "compressed-tensors", "kv_cache_dtype": "fp8"},
         "fp8_vit": {"quantization": "fp8", "mm_encoder_quantization": "fp8"},
         "gptq_w4": {"quantization": "gptq"},
         "gptq_int8_down": {"quantization": "gptq", "hf_overrides": {"quantization_config": {
             "quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
             "sym": False, "dynamic": {"+:.*down_proj": {"bits": 8}}}}}}
DEFAULT_MODES = "bf16,w4a16,fp8"
REAL_SHAPES = {"qkv": (4608, 4096), "o": (4096, 4096), "gate_up": (27392, 4096),
               "down": (4096, 13696)}
SMOKE_SHAPES = {"qkv": (192, 128), "down": (128, 256)}


def emit(kind: str, **kw) -> None:
    print(json.dumps({"kind": kind, **kw}, default=str), flush=True)


# ---- (a) and (b): kernels --------------------------------------------------------------------
def weight_sets(n, k, device, dtype):
    import torch

    from autoglm_serve.quantization.fp8 import quantize_rows
    from autoglm_serve.quantization.packing import pack_last_dim
    g = torch.Generator().manual_seed(n * 31 + k)
    out = {}
    for name, bits, zeros in (("w4a16_zp", 4, True), ("w4a16_sym", 4, False), ("w8a16", 8, True)):
        q = torch.randint(0, 1 << bits, (n, k), generator=g)
        s = (torch.rand(n, k // 128, generator=g) * 2e-3 + 1e-4).to(dtype)
        z = (torch.randint(0, 1 << bits, (n, k // 128), generator=g, dtype=torch.uint8)
             if zeros else None)
        out[name] = dict(qweight=pack_last_dim(q, bits).to(device), scales=s.to(device),
                         zeros=None if z is None else z.to(device), bits=bits)
    w = (torch.randn(n, k, generator=g) * 0.02).to(device=device, dtype=dtype)
    wq, ws = quantize_rows(w)
    out["fp8"] = dict(weight=wq, weight_scale=ws.view(-1))
    out["bf16"] = dict(weight=w)
    return out


def run_kernel(name, ws, x):
    import torch.nn.functional as F
    if name == "bf16":
        return F.linear(x, ws["weight"])
    if name == "fp8":
        from autoglm_serve.quantization.fp8 import fp8_linear
        return fp8_linear(x, ws["weight"], ws["weight_scale"], None)
    if x.is_cuda:
        from autoglm_serve.kernels.wna16 import wna16_linear
        return wna16_linear(x, ws["qweight"], ws["scales"], ws["zeros"], ws["bits"], 128)
    from autoglm_serve.quantization.wna16 import dequantize
    return F.linear(x, dequantize(ws["qweight"], ws["scales"], ws["zeros"], ws["bits"], x.dtype))


def reference(name, ws, x):
    import torch
    import torch.nn.functional as F

    from autoglm_serve.quantization.fp8 import quantize_rows
    from autoglm_serve.quantization.wna16 import dequantize
    if name == "bf16":
        return F.linear(x.float(), ws["weight"].float())
    if name == "fp8":
        xq, xs = quantize_rows(x)
        return F.linear(xq.float() * xs, ws["weight"].float() * ws["weight_scale"][:, None])
    return F.linear(x.float(), dequantize(ws["qweight"], ws["scales"], ws["zeros"], ws["bits"],
                                          torch.float32))


def weight_bytes(name, ws) -> int:
    return sum(t.numel() * t.element_size() for t in ws.values() if hasattr(t, "numel"))


def time_us(fn, smoke: bool) -> float:
    """Median of 5 replays of a CUDA graph of 20 calls (CPU: wall time of 3 calls)."""
    import torch
    if smoke:
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        return (time.perf_counter() - t0) / 3 * 1e6
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / 20)
    return sorted(times)[2]


def kernels(args) -> list[dict]:
    import torch
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.bfloat16
    shapes = SMOKE_SHAPES if args.smoke else REAL_SHAPES
    rows = []
    for shape_name, (n, k) in shapes.items():
        sets = weight_sets(n, k, device, dtype)
        for m in (1, 16) if args.smoke else (1, 16, 256, 4096):
            x = torch.randn(m, k, device=device, dtype=dtype)
            for name, ws in sets.items():
                row = dict(shape=shape_name, n=n, k=k, m=m, kernel=name)
                try:
                    out = run_kernel(name, ws, x)
                    ref = reference(name, ws, x)
                    row.update(max_abs_err=(out.float() - ref).abs().max().item(),
                               rel_err=((out.float() - ref).norm() / ref.norm()).item())
                    row["us"] = time_us(lambda name=name, ws=ws, x=x: run_kernel(name, ws, x),
                                        args.smoke)
                    row["weight_gb_s"] = weight_bytes(name, ws) / row["us"] / 1e3
                except Exception as e:
                    traceback.print_exc()
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                emit("kernel", **row)
                rows.append(row)
        if args.sweep:
            rows += sweep_decode_configs(shape_name, n, k, sets["w4a16_zp"], device, dtype,
                                         args.smoke)
        del sets
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


SWEEP = [(16, 16, 128), (16, 16, 256), (16, 16, 512), (16, 32, 256), (16, 64, 128),
         (16, 32, 512), (16, 8, 512)]


def sweep_decode_configs(shape_name, n, k, ws, device, dtype, smoke) -> list[dict]:
    """W4A16 decode (M = 1 and 16) under each candidate tile: the fastest goes in
    kernels/wna16.py's TUNED table (printed at the end)."""
    import torch

    from autoglm_serve.kernels.wna16 import WNA16Config, wna16_linear
    rows = []
    for m in (1, 16):
        x = torch.randn(m, k, device=device, dtype=dtype)
        for bm, bn, bk in SWEEP[:2] if smoke else SWEEP:
            cfg = WNA16Config(bm, bn, bk, 4, 3)     # (smoke: in the Triton interpreter)
            try:
                us = time_us(lambda: wna16_linear(x, ws["qweight"], ws["scales"], ws["zeros"], 4,
                                                  128, None, cfg), smoke)
            except Exception as e:
                emit("sweep", shape=shape_name, m=m, config=list(cfg), error=str(e)[:200])
                continue
            row = dict(kind="sweep", shape=shape_name, n=n, k=k, m=m, config=list(cfg), us=us,
                       weight_gb_s=weight_bytes("w4a16_zp", ws) / us / 1e3)
            emit(**row)
            rows.append(row)
    return rows


def tuned_table(rows) -> str:
    best = {}
    for r in rows:
        if r.get("kind") == "sweep":
            key = (16, r["n"], r["k"], 128)
            if r["m"] == 1 and (key not in best or r["us"] < best[key]["us"]):
                best[key] = r
    return "\n".join(f"    {key}: WNA16Config{tuple(r['config'])},  # {r['us']:.1f} us, "
                     f"{r['weight_gb_s']:.0f} GB/s" for key, r in best.items())


# ---- (c): the engine, one subprocess per mode -----------------------------------------------
def worker(args) -> None:
    import random

    import torch

    from autoglm_serve import LLM
    from autoglm_serve.models.layers.linear import LinearBase
    from engine_figures import fig_single, fig_throughput, token_floor
    t0 = time.monotonic()
    kw = dict(load_format="dummy", max_model_len=4096, max_num_seqs=256,
              skip_tokenizer_init=True, enable_prefix_caching=False, **MODES[args.worker])
    if args.smoke:
        kw.update(device="cpu", kv_cache_memory_gib=0.25, dtype="bfloat16")
    else:
        kw.update(gpu_memory_utilization=0.85)
    llm = LLM(args.model, **kw)
    loaded = llm.engine.core.loaded
    linear_bytes = sum(p.numel() * p.element_size() for mod in loaded.model.modules()
                       if isinstance(mod, LinearBase) for p in mod.parameters())
    emit("startup", mode=args.worker, seconds=time.monotonic() - t0, quantization=loaded.quantization,
         weight_gib=loaded.weight_bytes / 2**30, decoder_linear_gib=linear_bytes / 2**30,
         kv_tokens=llm.engine.core.cache.num_tokens)
    rng = random.Random(0)
    floor = token_floor(loaded.hf_config)
    fa = argparse.Namespace(output_len=args.output_len, input_len=args.input_len, single_runs=2,
                            figure_timeout_s=args.figure_timeout_s)
    emit("single", mode=args.worker, **fig_single(llm, fa, None, rng, floor))
    fa.output_len = args.throughput_output_len
    emit("throughput", mode=args.worker,
         **fig_throughput(llm, fa, None, rng, floor, args.num_requests))
    if torch.cuda.is_available():
        emit("memory", mode=args.worker, peak_gib=torch.cuda.max_memory_allocated() / 2**30)


def run_worker(args, mode: str, deadline: float) -> list[dict]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--model", args.model,
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--throughput-output-len", str(args.throughput_output_len),
           "--num-requests", str(args.num_requests),
           "--figure-timeout-s", str(args.figure_timeout_s)] + (["--smoke"] if args.smoke else [])
    lines = []
    timeout = max(10.0, deadline - time.monotonic())
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": os.environ.get(
                                  "OMP_NUM_THREADS", "1" if args.smoke else "8")})
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:   # past its share of --budget-s: keep what it said
        def text(raw):
            return raw.decode() if isinstance(raw, bytes) else (raw or "")
        out, err, code = text(e.stdout), text(e.stderr), "timeout"
    for line in out.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
            print(line, flush=True)
    # kernels/compile_watch.py's warnings: a figure that paid Triton compiles (a cold cache
    # makes the first mode's offline figure up to 2x slow where start-up missed a variant)
    compiles = [line for line in err.splitlines() if "compiled while serving" in line]
    if compiles:
        emit("compiles_while_serving", mode=mode, count=len(compiles), kernels=compiles[:30])
    if code != 0:
        emit("error", mode=mode, code=code, stderr=err[-3000:])
        lines.append(dict(kind="error", mode=mode, code=code))
    return lines


# ---- report ---------------------------------------------------------------------------------
def table(kernel_rows, engine_rows) -> str:
    out = ["| shape | M | kernel | max abs err | rel err | us | weight GB/s |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in kernel_rows:
        if r.get("kind") == "sweep":
            continue
        if "error" in r:
            out.append(f"| {r['shape']} | {r['m']} | {r['kernel']} | error: {r['error'][:60]} | | | |")
            continue
        out.append(f"| {r['shape']} {r['n']}x{r['k']} | {r['m']} | {r['kernel']} | "
                   f"{r['max_abs_err']:.2e} | {r['rel_err']:.2e} | {r['us']:.1f} | "
                   f"{r['weight_gb_s']:.0f} |")
    out += ["", "| mode | weights GiB | decoder linears GiB | KV tokens | single decode tok/s | "
            "offline out tok/s | vs bf16 |", "| --- | --- | --- | --- | --- | --- | --- |"]
    by = {}
    for r in engine_rows:
        by.setdefault(r.get("mode"), {})[r["kind"]] = r
    base = (by.get("bf16", {}).get("throughput") or {}).get("out_tok_s")
    for mode in MODES:
        if mode not in by:
            continue
        d = by[mode]
        s, t, th = d.get("startup", {}), d.get("single", {}), d.get("throughput", {})
        ratio = f"{th['out_tok_s'] / base:.2f}x" if base and th.get("out_tok_s") else ""
        fmt = lambda v, f=".1f": format(v, f) if isinstance(v, (int, float)) else "-"  # noqa: E731
        out.append(f"| {mode} | {fmt(s.get('weight_gib'), '.2f')} | "
                   f"{fmt(s.get('decoder_linear_gib'), '.2f')} | {fmt(s.get('kv_tokens'), 'd')} | "
                   f"{fmt(t.get('decode_tok_s'))} | "
                   f"{fmt(th.get('out_tok_s'))} | {ratio} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true", help="CPU, tiny GLM-4.1V, tiny shapes")
    p.add_argument("--worker", choices=list(MODES), default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default=None)
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"of {', '.join(MODES)}")
    p.add_argument("--skip-kernels", action="store_true")
    p.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True,
                   help="time W4A16 decode tiles (adds ~30 s of compiles)")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--throughput-output-len", type=int, default=128)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--figure-timeout-s", type=float, default=40.0)
    p.add_argument("--budget-s", type=float, default=230.0)
    args = p.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        import types

        from triton_interpreter_fixes import fix_interpreter   # the tests' interpreter fixes
        fix_interpreter(types.SimpleNamespace(setattr=setattr))
        if args.worker is None:
            args.input_len, args.output_len, args.throughput_output_len = 16, 4, 4
            args.num_requests, args.figure_timeout_s = 4, 60.0
    if args.worker:
        worker(args)
        return
    start = time.monotonic()
    if args.model is None:
        if args.smoke:
            import tempfile

            from glm4v_fixtures import make_tiny_glm4v
            args.model = str(make_tiny_glm4v(tempfile.mkdtemp(prefix="quant-bench-")))
        else:
            args.model = "autoglm-phone-9b"
    import torch
    emit("env", torch=torch.__version__, gpu=torch.cuda.get_device_name()
         if torch.cuda.is_available() else "cpu")
    kernel_rows = [] if args.skip_kernels else kernels(args)
    engine_rows = []
    modes = [m for m in args.modes.split(",") if m]
    for i, mode in enumerate(modes):
        # an equal share of what is left for each mode still to run
        left = start + args.budget_s - time.monotonic()
        engine_rows += run_worker(args, mode, time.monotonic() + left / (len(modes) - i))
    report = table(kernel_rows, engine_rows)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "quant_bench.json"), "w") as f:
            json.dump(dict(kernels=kernel_rows, engine=engine_rows), f, indent=1, default=str)
    print(report)
    if any(r.get("kind") == "sweep" for r in kernel_rows):
        print("kernels/wna16.py TUNED (M <= 16, fastest at M = 1):\n" + tuned_table(kernel_rows))
    print(f"total {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()

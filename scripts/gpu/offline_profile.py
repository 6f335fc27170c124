"""Where offline throughput goes, bf16 against FP8: the host's time per step beside the GPU's (GPU).

    python3 scripts/gpu/offline_profile.py [--modes bf16,fp8] [--budgets 2048,8192,16384]
    python3 scripts/gpu/offline_profile.py --smoke     # CPU, a tiny GLM-4.1V (checks the script)

AutoGLM-Phone-9B with random weights, the offline figure of quant_bench.py (256 requests of 512
random token ids, 128 tokens out, greedy, no prefix caching), each mode in its own subprocess.
For each step budget (max_num_batched_tokens, set between runs on one engine loaded with the
largest) a warm run, then a timed one with the core's record of every step
(engine/step_trace.py's StepRecord): prompt steps and decode-only steps, the host's schedule and
launch time against its wait for the device. Then a smaller run under torch.profiler: the GPU's
busy time against the wall and the kernels that took the most. A host-bound run shows launch
time near the step's and ~0 wait; a device-bound one the reverse.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), HERE]

from engine_figures import emit, kernel_busy_time  # noqa: E402
from quant_bench import MODES  # noqa: E402


def set_budget(core, tokens: int) -> None:
    core.max_num_batched_tokens = tokens
    core.scheduler.max_num_batched_tokens = tokens


def recorded_run(llm, prompts, params) -> tuple[float, int, list]:
    """(seconds, output tokens, each step's StepRecord with its prompt tokens: read as the step
    ends, when its requests' computed tokens count it and no later step)."""
    from autoglm_serve.engine.step_trace import step_rows
    engine, records = llm.engine, []
    step = engine.step

    def recording_step():
        outs = step()
        record = engine.core.last_step
        if record is not None:
            records.append((record, step_rows(record)[1]))
        return outs

    engine.step = recording_step
    try:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        seconds = time.perf_counter() - t0
    finally:
        del engine.step
    return seconds, sum(len(o.outputs[0].token_ids) for o in outs), records


def step_summary(records) -> dict:
    """The steps that carried a prompt chunk (decodes beside it included) and the others."""
    def part(rs):
        tot = {k: 1e3 * sum(getattr(r, k) or 0 for r, _ in rs)
               for k in ("encode_s", "schedule_s", "launch_s", "wait_s", "sync_s")}
        return dict(steps=len(rs), **{k.replace("_s", "_ms"): round(v, 1) for k, v in tot.items()},
                    tokens=sum(r.scheduled.num_batched_tokens for r, _ in rs),
                    prompt_tokens=sum(n for _, n in rs))
    return dict(prompt_steps=part([(r, n) for r, n in records if n]),
                decode_steps=part([(r, n) for r, n in records if not n]))


def allocator_syncs() -> dict:
    """The caching allocator's cudaFree calls and retries so far: each synchronizes the
    device, so a launch into a full cache also waits there (none off a GPU)."""
    import torch
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {"device_frees": stats.get("num_device_free", 0),
            "alloc_retries": stats.get("num_alloc_retries", 0)}


def profiled_run(llm, prompts, params) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        llm.generate(prompts, params)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type.name == "CUDA")
    busy, _ = kernel_busy_time([(start, stop) for start, stop, _ in kernels])
    by_name = {}
    for start, stop, name in kernels:
        by_name[name] = by_name.get(name, 0.0) + (stop - start)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return dict(wall_ms=round(1e3 * wall, 1), gpu_busy_ms=round(busy / 1e3, 1),
                kernel_count=len(kernels),
                top_kernels=[(name[:70], round(us / 1e3, 1)) for name, us in top])


def worker(args) -> None:
    import torch

    from autoglm_serve import LLM, SamplingParams
    from engine_figures import token_floor
    budgets = [int(b) for b in args.budgets.split(",")]
    kw = dict(load_format="dummy", max_model_len=4096, max_num_seqs=256,
              max_num_batched_tokens=max(budgets), skip_tokenizer_init=True,
              enable_prefix_caching=False, **MODES[args.worker])
    if args.smoke:
        from glm4v_fixtures import make_tiny_glm4v
        import tempfile
        model = str(make_tiny_glm4v(os.path.join(tempfile.mkdtemp(), "tiny-glm4v")))
        kw.update(device="cpu", kv_cache_memory_gib=0.25, dtype="bfloat16")
        kw.pop("quantization", None)
    else:
        model = "autoglm-phone-9b"
        kw.update(gpu_memory_utilization=0.85)
    llm = LLM(model, **kw)
    rng = random.Random(0)
    floor = token_floor(llm.engine.core.loaded.hf_config)
    prompts = [[rng.randrange(floor) for _ in range(args.input_len)]
               for _ in range(args.num_requests)]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    for budget in budgets:
        set_budget(llm.engine.core, budget)
        recorded_run(llm, prompts, params)            # warm: compiles, plans, allocator
        before = allocator_syncs()
        seconds, n, records = recorded_run(llm, prompts, params)
        emit("run", mode=args.worker, budget=budget, seconds=round(seconds, 3),
             out_tok_s=round(n / seconds, 1), **step_summary(records),
             **{k: v - before[k] for k, v in allocator_syncs().items()})
        if args.profile_requests:
            emit("profile", mode=args.worker, budget=budget,
                 **profiled_run(llm, prompts[:args.profile_requests], params))
    if torch.cuda.is_available():
        emit("memory", mode=args.worker, peak_gib=torch.cuda.max_memory_allocated() / 2**30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="bf16,fp8")
    ap.add_argument("--budgets", default="2048,8192,16384")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--profile-requests", type=int, default=64,
                    help="requests of the torch.profiler run (0: none)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.modes, args.budgets = "bf16", "64,256"
        args.num_requests, args.input_len, args.output_len, args.profile_requests = 8, 48, 24, 4
    if args.worker:
        return worker(args)
    for mode in args.modes.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode,
               "--budgets", args.budgets, "--num-requests", str(args.num_requests),
               "--input-len", str(args.input_len), "--output-len", str(args.output_len),
               "--profile-requests", str(args.profile_requests)] + \
              (["--smoke"] if args.smoke else [])
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": os.environ.get(
                                  "OMP_NUM_THREADS", "1" if args.smoke else "8")})
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                print(line, flush=True)
        if proc.returncode:
            print(f"{mode}: exit {proc.returncode}\n{proc.stderr[-3000:]}", flush=True)
            sys.exit(1)


if __name__ == "__main__":
    main()

"""Where the phone-agent workload's mixed steps wait: host syncs and GPU time (GPU).

    python scripts/gpu/mixed_step_profile.py [--requests 16] [--max-tokens 48] [--sync-debug]

The served step trace (phone_agent_bench.py, `serve --step-trace`) shows 30-40 ms of host time
in the launch of a prompt chunk and up to ~90 ms in the step that starts a screenshot's vision
tower, and almost no wait after them. That launch is the host's own CPU (its launch_cpu_ms:
the eager forward's ~400 launches, BENCHMARKS.md of 2026-12-07), not a wait for the device.
This runs the same kind of steps offline (AutoGLM-Phone-9B, random weights, --requests
conversations each with its own screenshot after ~1,500 tokens of history, Open-AutoGLM's
sampling) under torch.profiler, and prints the host calls that wait for the device
(synchronizations, copies from pageable memory, scalar reads) with the Python lines they come
from, the host time of each step part (engine/step_trace.py), and the GPU's busy share of the
wall time.

--sync-debug runs the same steps without the profiler (whose per-op cost hides the host's own
pace) under torch.cuda.set_sync_debug_mode("warn"): every host call that waits for the device,
counted by the engine's frames that made it, and NVML's busy share of the wall.
"""
from __future__ import annotations

import argparse
import base64
import io
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autoglm_serve import LLM, SamplingParams  # noqa: E402

SCREENSHOT = os.path.join(ROOT, "..", "shared", "data", "phone_screenshot_1080x2400.png")
SYNC_OPS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
            "cudaMemcpy", "cudaMemcpyAsync", "aten::_local_scalar_dense", "aten::nonzero",
            "aten::item", "cudaStreamWaitEvent")


def screenshots(n: int) -> list[str]:
    from PIL import Image
    if os.path.exists(SCREENSHOT):
        base = Image.open(SCREENSHOT).convert("RGB")
    else:
        base = Image.new("RGB", (1080, 2400), (200, 210, 220))
    urls = []
    for k in range(n):
        im = base.copy()
        im.paste(((37 * k) % 255, (91 * k) % 255, 128), (0, 0, 60, 60))   # its own hash
        buf = io.BytesIO()
        im.save(buf, "PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    return urls


def conversation(k: int, url: str) -> list[dict]:
    history = " ".join(f"step {i}: tapped element {k * 7 + i} and the screen changed."
                       for i in range(120))
    return [{"role": "system", "content": "You are a phone operating agent. " * 40},
            {"role": "user", "content": [{"type": "text", "text": f"task {k}. {history}"},
                                         {"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": f"** Screen Info ** {k}"}]}]


def step_kind(rec) -> str:
    tokens = sum(s.num_new_tokens for s in rec.scheduled.scheduled if s.num_new_tokens > 1)
    return ("both" if tokens and rec.encoder_tokens else "vision" if rec.encoder_tokens
            else "prompt" if tokens else "decode")


def print_step_table(records) -> None:
    """Mean host time of each step part (engine/step_trace.py), by step kind."""
    parts = ("encode_s", "schedule_s", "launch_s", "wait_s")
    kinds = {"decode": [], "prompt": [], "vision": [], "both": []}
    for seconds, rec in records:
        if rec is not None:
            kinds[step_kind(rec)].append((seconds, rec))
    print("\n| step kind | steps | step ms | " + " | ".join(p[:-2] + " ms" for p in parts) + " |")
    print("| --- | --- | --- |" + " --- |" * len(parts))
    for kind, rows in kinds.items():
        if rows:
            means = [statistics.mean(getattr(r, p) for _, r in rows) * 1e3 for p in parts]
            print(f"| {kind} | {len(rows)} | {statistics.mean(s for s, _ in rows) * 1e3:.1f} | "
                  + " | ".join(f"{m:.1f}" for m in means) + " |")


def sync_audit(engine, core) -> None:
    """Steps to the end with every synchronizing CUDA call reported, grouped by the stack of
    the engine's own frames that made it."""
    import traceback
    import warnings
    from collections import Counter

    from autoglm_serve.bench.gpu_monitor import GpuMonitor
    stacks: Counter = Counter()
    current = {"kind": "?"}

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "autoglm_serve" in f.filename]
        where = tuple(f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} {f.name}"
                      for f in frames[-4:])
        stacks[(current["kind"], str(message)[:60], where)] += 1

    warnings.showwarning = record
    warnings.simplefilter("always")
    monitor = GpuMonitor(interval_s=0.05)
    monitor.start()
    t0 = time.perf_counter()
    torch.cuda.set_sync_debug_mode("warn")
    records = []
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        rec = core.last_step
        current["kind"] = step_kind(rec) if rec is not None else "?"
        records.append((time.perf_counter() - t, rec))
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    monitor.stop()
    stats = monitor.stats(t0, t1)
    print(f"{len(records)} steps in {t1 - t0:.2f} s; NVML busy {stats.util_mean}% "
          f"({stats.samples} samples)")
    print_step_table(records)
    print("\n== synchronizing calls (kind of the step before, message, engine frames)")
    for (kind, message, where), count in stacks.most_common(25):
        print(f"\n{count} x [{kind}] {message}")
        for frame in where:
            print(f"    {frame}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--server-args", default="",
                    help="engine arguments, e.g. decode_step_tokens=1024 quantization=fp8")
    ap.add_argument("--sync-debug", action="store_true")
    args = ap.parse_args()
    # the server's step budget (the offline API's default is larger on a GPU)
    extra = {"max_num_batched_tokens": 2048}
    for kv in args.server_args.split():
        k, v = kv.split("=")
        extra[k] = int(v) if v.isdigit() else v
    llm = LLM("autoglm-phone-9b", load_format="dummy", dtype="bfloat16", max_model_len=25480,
              mm_processor_kwargs={"max_pixels": 5_000_000}, limit_mm_per_prompt={"image": 10},
              **extra)
    sp = SamplingParams(temperature=0, top_p=0.85, frequency_penalty=0.2,
                        max_tokens=args.max_tokens, ignore_eos=True)
    urls = screenshots(args.requests + 1)
    llm.chat(conversation(999, urls[-1]), sp)          # warm: compiles, caches the system turn
    engine, core = llm.engine, llm.engine.core
    for k in range(args.requests):
        prompt = engine.frontend.prepare_chat(conversation(k, urls[k]))
        engine.add_request(engine.frontend.next_request_id(), prompt, sp, final_only=True)

    if args.sync_debug:
        sync_audit(engine, core)
        return
    from torch.profiler import ProfilerActivity, profile
    records = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        while engine.has_unfinished():
            t = time.perf_counter()
            engine.step()
            records.append((time.perf_counter() - t, core.last_step))
        torch.cuda.synchronize()
    wall = time.perf_counter() - start

    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    print(f"{len(records)} steps in {wall:.2f} s; GPU kernel time {gpu_us / 1e6:.2f} s "
          f"({100 * gpu_us / 1e6 / wall:.0f}% of the wall, kernels summed; profiler overhead "
          f"included)")
    print_step_table(records)

    print("\n== host calls that can wait for the device (self CPU time), by Python stack")
    stacked = prof.key_averages(group_by_stack_n=6)
    waits = sorted((e for e in stacked if e.key in SYNC_OPS), key=lambda e: -e.self_cpu_time_total)
    for e in waits[:14]:
        print(f"\n{e.key}: {e.count} calls, {e.self_cpu_time_total / 1e3:.1f} ms")
        for frame in (e.stack or [])[:6]:
            print(f"    {frame}")
    print("\n== top CUDA kernels")
    print(events.table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60))


if __name__ == "__main__":
    main()

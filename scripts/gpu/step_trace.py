"""Where the offline figure's time goes, step by step (GPU).

    python scripts/gpu/step_trace.py [--num-requests 512] [--max-num-batched-tokens 8192]

Runs the offline workload of engine_bench.py (N requests of 512 random tokens, 256 new tokens,
all submitted together) on AutoGLM-Phone-9B with dummy weights, and records for every step:
tokens, decode rows, the host time of ``runner.launch`` (inputs, graph replay or forward,
sampling, all queued), and the device span between CUDA events recorded before and after it
(the step's GPU time, plus any wait for the host inside the launch). Prints totals for
prefill-carrying and decode-only steps and a sample of steps; writes every step to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autoglm_serve import LLM, SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "step_trace.json"))
    args = ap.parse_args()

    llm = LLM("autoglm-phone-9b", load_format="dummy", dtype="bfloat16", max_model_len=8192,
              max_num_seqs=512, max_num_batched_tokens=args.max_num_batched_tokens,
              skip_tokenizer_init=True, gpu_memory_utilization=0.85)
    runner = llm.engine.core.runner
    steps = []
    launch = runner.launch

    def traced_launch(scheduled):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        result = launch(scheduled)
        end.record()
        steps.append(dict(t0=t0, t1=time.perf_counter(), events=(start, end),
                          tokens=sum(s.num_new_tokens for s in scheduled),
                          decodes=sum(1 for s in scheduled if s.num_new_tokens == 1)))
        return result

    runner.launch = traced_launch
    rng = random.Random(0)
    llm.generate([[rng.randrange(150000) for _ in range(64)]], SamplingParams(max_tokens=4))
    steps.clear()
    prompts = [[rng.randrange(150000) for _ in range(512)] for _ in range(args.num_requests)]
    t = time.perf_counter()
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=256, ignore_eos=True))
    wall = time.perf_counter() - t
    torch.cuda.synchronize()

    for i, s in enumerate(steps):
        start, end = s.pop("events")
        s["gpu_ms"] = start.elapsed_time(end)
        s["launch_ms"] = 1e3 * (s["t1"] - s["t0"])
        s["host_gap_ms"] = 1e3 * (steps[i + 1]["t0"] - s["t1"]) if i + 1 < len(steps) else 0.0
        s["at_s"] = s["t0"] - steps[0]["t0"]
    gpu_s = sum(s["gpu_ms"] for s in steps) / 1e3
    print(f"{args.num_requests} requests: wall {wall:.2f} s, {len(steps)} steps, "
          f"device spans {gpu_s:.2f} s ({100 * gpu_s / wall:.0f}% of wall)")
    for kind, group in (("prefill-carrying", [s for s in steps if s["tokens"] > s["decodes"]]),
                        ("decode-only", [s for s in steps if s["tokens"] == s["decodes"]])):
        if group:
            mean = lambda key: statistics.mean(s[key] for s in group)  # noqa: E731
            print(f"{kind}: {len(group)} steps, device {sum(s['gpu_ms'] for s in group) / 1e3:.2f} s "
                  f"(mean {mean('gpu_ms'):.1f} ms), {mean('tokens'):.0f} tokens a step, "
                  f"launch {mean('launch_ms'):.1f} ms, host gap to the next launch "
                  f"{mean('host_gap_ms'):.1f} ms")
    for s in steps[::max(1, len(steps) // 25)]:
        print(f"  t={s['at_s']:.2f}s tokens {s['tokens']} decodes {s['decodes']} "
              f"device {s['gpu_ms']:.1f} ms launch {s['launch_ms']:.1f} ms "
              f"gap {s['host_gap_ms']:.1f} ms")
    with open(args.out, "w") as f:
        json.dump(dict(wall_s=wall, steps=[{k: v for k, v in s.items() if k not in ("t0", "t1")}
                                           for s in steps]), f)


if __name__ == "__main__":
    main()

"""Decode steps of a small batch at long context: what one costs and where it goes (GPU).

    python scripts/gpu/decode_trace.py [--rows 1,16] [--contexts 100,4000,10000] [--profile]
        [--separate-kv-write] [--quantization fp8]

The phone-agent issue's question: 16 decoding agents at ~4,000 tokens of context took 14-15 ms
a step served, against ~5 ms for the GEMMs alone. For each context length this submits --rows
random prompts of that length on AutoGLM-Phone-9B with dummy weights (the served engine's
limits: --max-model-len 25480), lets them decode --decode-steps tokens with Open-AutoGLM's
sampling (--sampling oa) or greedy, and prints the median wall time between decode-only steps
(what a streaming client sees) and the device span of one. --profile adds the top CUDA kernels
of a few decode steps at the longest context and the largest row count (torch.profiler).
--separate-kv-write makes decode steps write their K/V with the write kernel, as before the
decode kernel did it itself (the A/B of that change).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autoglm_serve import LLM, SamplingParams  # noqa: E402

SAMPLING = {
    "greedy": dict(temperature=0.0),
    "oa": dict(temperature=0.0, top_p=0.85, frequency_penalty=0.2),   # Open-AutoGLM's
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="16", help="comma-separated row counts")
    ap.add_argument("--contexts", default="100,4000,10000")
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--sampling", default="greedy,oa")
    ap.add_argument("--max-model-len", type=int, default=25480)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--separate-kv-write", action="store_true")
    ap.add_argument("--quantization", default=None, help="e.g. fp8 or compressed-tensors")
    args = ap.parse_args()
    if args.separate_kv_write:
        from autoglm_serve.models.layers.triton_attention import TritonAttentionBackend
        TritonAttentionBackend.fuse_decode_kv_write = False
    row_counts = [int(r) for r in args.rows.split(",")]

    llm = LLM("autoglm-phone-9b", load_format="dummy", dtype="bfloat16",
              max_model_len=args.max_model_len, skip_tokenizer_init=True,
              gpu_memory_utilization=0.85, quantization=args.quantization)
    runner = llm.engine.core.runner
    steps: list[tuple[float, int, int, torch.cuda.Event, torch.cuda.Event]] = []
    launch = runner.launch

    def traced_launch(scheduled):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = launch(scheduled)
        end.record()
        steps.append((time.perf_counter(), sum(s.num_new_tokens for s in scheduled),
                      len(scheduled), start, end))
        return result

    runner.launch = traced_launch
    rng = random.Random(0)
    print("| rows | context | sampling | step wall ms (median) | device ms (median) |")
    print("| --- | --- | --- | --- | --- |")
    for rows, ctx in [(r, int(c)) for r in row_counts for c in args.contexts.split(",")]:
        for mode in args.sampling.split(","):
            prompts = [[rng.randrange(150000) for _ in range(ctx)] for _ in range(rows)]
            # prefix-cached first: otherwise at 10,000 tokens the first prompts finish
            # decoding before the last one's prefill is done, and no step decodes all rows
            llm.generate(prompts, SamplingParams(max_tokens=1))
            steps.clear()
            llm.generate(prompts, SamplingParams(max_tokens=args.decode_steps, ignore_eos=True,
                                                 **SAMPLING[mode]))
            torch.cuda.synchronize()
            decode = [i for i, s in enumerate(steps) if s[1] == s[2] == rows]
            walls = [1e3 * (steps[i][0] - steps[i - 1][0]) for i in decode[1:] if i - 1 in decode]
            device = [steps[i][3].elapsed_time(steps[i][4]) for i in decode]
            print(f"| {rows} | {ctx} | {mode} | {statistics.median(walls):.2f} | "
                  f"{statistics.median(device):.2f} |", flush=True)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        ctx, rows = max(int(c) for c in args.contexts.split(",")), max(row_counts)
        prompts = [[rng.randrange(150000) for _ in range(ctx)] for _ in range(rows)]
        llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))   # prefix cached
        for mode in args.sampling.split(","):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True,
                                                     **SAMPLING[mode]))
                torch.cuda.synchronize()
            print(f"\n== profile: {rows} rows, context {ctx}, {mode}, 24 tokens")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22,
                                            max_name_column_width=70))


if __name__ == "__main__":
    main()

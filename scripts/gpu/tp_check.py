"""Tensor parallelism on 2 GPUs (NCCL, CUDA graphs with the all-reduces inside): TP=2 against
TP=1 on the same weights, greedy tokens and decode speed.

    python scripts/gpu/tp_check.py [--model PATH] [--tp 2]

Without --model: a tiny random GLM-4.1V written to a temporary folder (tokens compared); with
the real AutoGLM-Phone-9B checkpoint the speeds are the figures worth keeping. Prints, per TP
size: start-up seconds, whether decode graphs were captured, the tokens' agreement with TP=1
(bf16: greedy paths may part after a near tie, so the first tokens count), and decode tok/s at
batch 1 and 32. Runs in ~1-2 minutes on H200s with the tiny model.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT]

from autoglm_serve import LLM, SamplingParams  # noqa: E402


def measure(model: str, tp: int, prompts, max_tokens: int):
    t0 = time.monotonic()
    llm = LLM(model, tensor_parallel_size=tp, max_model_len=4096, skip_tokenizer_init=True,
              kv_cache_memory_gib=8)   # the same cache at both sizes, freed between them
    start = time.monotonic() - t0
    graphs = llm.engine.core.runner.graphs is not None
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    tokens = [o.outputs[0].token_ids for o in llm.generate(prompts[:4], params)]
    speeds = {}
    for batch in (1, 32):
        t = time.monotonic()
        llm.generate([prompts[i % len(prompts)] for i in range(batch)], params)
        speeds[batch] = batch * max_tokens / (time.monotonic() - t)
    llm.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return start, graphs, tokens, speeds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    model = args.model
    if model is None:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from glm4v_fixtures import make_tiny_glm4v
        model = str(make_tiny_glm4v(tempfile.mkdtemp(prefix="tiny-glm4v-")))
    prompts = [[(7 * k + j) % 200 + 1 for k in range(20 + 13 * j)] for j in range(8)]
    rows = []
    ref = None
    for tp in (1, args.tp):
        start, graphs, tokens, speeds = measure(model, tp, prompts, args.max_tokens)
        ref = ref or tokens
        first = sum(a[:4] == b[:4] for a, b in zip(tokens, ref))
        full = sum(a == b for a, b in zip(tokens, ref))
        rows.append(f"| {tp} | {start:.1f} | {graphs} | {first}/{len(ref)} | {full}/{len(ref)} "
                    f"| {speeds[1]:.0f} | {speeds[32]:.0f} |")
    print("| TP | start s | graphs | first 4 tokens = TP1 | all tokens = TP1 | tok/s b1 | tok/s b32 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

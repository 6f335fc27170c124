"""Decode of the embedded default at 100 and at 4,000 tokens of context, ms a token (issue 19's
"decode at 4,000 tokens within 1.5x of decode at 100"), and each prompt's time to its first
token, in alternating rounds.

    python scripts/bench_cpu_long_context.py [--dtype bfloat16] [--rounds 2]

Threads: the engine's default (adaptive), or OMP_NUM_THREADS when set. A decode token's time is
(last token - first token) / (new tokens - 1) of one greedy request without prefix caching, so
prefill is left out; the load averages are printed with each figure.
"""
from __future__ import annotations

import argparse
import os

import torch

from autoglm_serve.llm import LLM
from autoglm_serve.sampling_params import SamplingParams

NEW_TOKENS = 33


def decode_ms(llm: LLM, context: int) -> tuple[float, float]:
    """(decode ms a token, ms to the first token)."""
    ids = [[(i * 7919) % 40000 + 100 for i in range(context)]]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    m = llm.generate(ids, params)[0].metrics
    return ((m.last_token_time - m.first_token_time) / (NEW_TOKENS - 1) * 1000,
            (m.first_token_time - m.arrival_time) * 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    llm = LLM(dtype=args.dtype, max_model_len=4608, skip_tokenizer_init=True,
              enable_prefix_caching=False)
    decode_ms(llm, 100)     # warm-up
    for _ in range(args.rounds):
        for context in (100, 4000):
            ms, first = decode_ms(llm, context)
            load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"{args.dtype} context {context}: {ms:.1f} ms a token, first token "
                  f"{first:.0f} ms, threads {torch.get_num_threads()}, load {load}", flush=True)


if __name__ == "__main__":
    main()

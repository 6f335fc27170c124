"""Offline greedy throughput of the embedded default on this CPU: our LLM.generate against
transformers' padded `generate` and its continuous-batching `generate_batch`, same run.

    OMP_NUM_THREADS=1 python scripts/bench_cpu_offline.py [--num-prompts 64] [--new-tokens 64]

Prints a markdown table (output tokens/s, wall time) and how many greedy outputs agree
exactly with ours. Other processes on a shared CPU skew all three alike; the load averages
are printed with the table so a reader can judge.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SUBJECTS = ["the moon", "coffee", "a phone battery", "rain", "the Eiffel Tower", "bicycles",
            "honey bees", "chess", "a volcano", "Wi-Fi", "penguins", "the piano", "bread",
            "solar panels", "a lighthouse", "email"]
TASKS = ["Tell me one fact about {}.",
         "Write a short poem about {} in the style of a children's song with a happy ending.",
         "Explain how {} works to a ten-year-old, step by step, using simple words and one "
         "everyday example that they would know from school or home.",
         "What is {}?"]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    questions = [t.format(s) for t in TASKS for s in SUBJECTS][:n]
    return [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False) for q in questions]


def bench_ours(prompts, new_tokens):
    from autoglm_serve import LLM, SamplingParams
    llm = LLM(max_model_len=2048)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))   # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return time.perf_counter() - start, [o.outputs[0].token_ids for o in outs]


def load_hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from autoglm_serve.loader import default_model_path
    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval(), tok


def bench_hf_generate(model, tok, prompts, new_tokens, batch_size):
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    results = []
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 pad_token_id=pad)
        results.extend(out[:, width:].tolist())
    return time.perf_counter() - start, results


def bench_hf_generate_batch(model, prompts, new_tokens):
    from transformers import GenerationConfig
    if not hasattr(model, "generate_batch"):
        return None, None
    # eos set to a token id that never appears: every request runs its full new_tokens
    cfg = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                           pad_token_id=0)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate_batch(inputs=prompts, generation_config=cfg)
    elapsed = time.perf_counter() - start
    return elapsed, [r.generated_tokens for r in out.values()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hf-batch-size", type=int, default=64)
    ap.add_argument("--skip-generate-batch", action="store_true")
    args = ap.parse_args()
    model, tok = load_hf()
    prompts = chat_prompts(tok, args.num_prompts)
    lens = [len(p) for p in prompts]
    rows = []
    ours_t, ours = bench_ours(prompts, args.new_tokens)
    rows.append(("autoglm-serve LLM.generate", ours_t, ours))
    t, hf = bench_hf_generate(model, tok, prompts, args.new_tokens, args.hf_batch_size)
    rows.append((f"transformers generate (padded, batch {args.hf_batch_size})", t, hf))
    if not args.skip_generate_batch:
        try:
            t, hfb = bench_hf_generate_batch(model, prompts, args.new_tokens)
            if t is not None:
                rows.append(("transformers generate_batch (paged)", t, hfb))
        except Exception as exc:   # report, do not hide, a missing/broken baseline
            print(f"generate_batch failed: {type(exc).__name__}: {exc}")
    n_out = args.num_prompts * args.new_tokens
    print(f"\n{args.num_prompts} prompts ({min(lens)}-{max(lens)} tokens, mean "
          f"{sum(lens) / len(lens):.0f}), {args.new_tokens} new tokens each, greedy, float32, "
          f"torch threads {torch.get_num_threads()}, load avg {os.getloadavg()}\n")
    print("| engine | output tok/s | total s | greedy outputs equal to ours |")
    print("| --- | ---: | ---: | ---: |")
    for name, t, toks in rows:
        same = sum(a == b for a, b in zip(ours, toks))
        lengths_ok = all(len(x) == args.new_tokens for x in toks)
        print(f"| {name} | {n_out / t:.1f} | {t:.1f} | {same}/{len(ours)}"
              f"{'' if lengths_ok else ' (some outputs short)'} |")


if __name__ == "__main__":
    main()

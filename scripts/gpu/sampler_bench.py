"""The sampler's time and peak memory by its row groups (GPU).

    python3 scripts/gpu/sampler_bench.py [--rows 16,64,256] [--groups 24,23,22]
    python3 scripts/gpu/sampler_bench.py --smoke     # CPU, small rows (checks the script)

engine/core/sampler.py samples rows in groups of at most 2**g elements of each [rows, vocab]
buffer, so that its peak memory stays bounded; the start-up memory plan reserves that peak
beside the KV cache (its worst step samples max_num_seqs rows with every option). Smaller
groups free memory for the KV cache and cost launches, and device time where rows sample
with top-p (a sort a group). For each row count, group size and
sampling (Open-AutoGLM's: greedy with frequency_penalty 0.2, the penalty counts kept on the
device as the engine keeps them; a chat client's: temperature 0.7, top_p 0.85; the profile's
worst: every option and logprobs) this prints the median time of one call with its sync (the
host's launches included), the median device time of its kernels alone (``gpu_ms``: launched
behind a sleep kernel, so the launches are queued before the first runs: in the engine they
overlap the forward on the GPU) and the allocator's peak above its start, with GLM-4.1V's
151,552-token vocabulary, and whether its first call's tokens equal those of the first group
size and logits dtype (seeded rows: grouping must change no token, nor the logits' dtype where
the values are the same). Prints a JSON line per case.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from autoglm_serve.engine.core.sampler import Sampler, SamplingRow, make_generator  # noqa: E402
from autoglm_serve.sampling_params import MAX_LOGPROBS, SamplingParams  # noqa: E402

VOCAB = 151_552
CONTEXT = 4_000      # tokens of each row's prompt and output history
SAMPLINGS = {
    "open-autoglm": dict(temperature=0.0, top_p=0.85, frequency_penalty=0.2),
    "chat": dict(temperature=0.7, top_p=0.85),
    "worst": dict(temperature=1.0, top_p=0.85, min_p=0.01, repetition_penalty=1.1,
                  frequency_penalty=0.2, logprobs=MAX_LOGPROBS, min_tokens=1),
}


SLEEP_CYCLES = 200_000_000      # ~0.1 s at an H100's or H200's clock: longer than the launches


def device_seconds(call) -> float | None:
    """The time of call's kernels on the device alone, or None where the host's launches took
    longer than the sleep in front of them (the figure would hold launch gaps)."""
    torch.cuda.synchronize()
    before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    before.record()
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    t0 = time.perf_counter()
    call()
    end.record()
    host = time.perf_counter() - t0
    end.synchronize()
    slept = before.elapsed_time(start) / 1e3
    return None if host >= slept else start.elapsed_time(end) / 1e3


def case(device, rows: int, vocab: int, name: str, group_elements: int, dtype: torch.dtype,
         repeats: int) -> tuple[float, float | None, int, list[int]]:
    params = SamplingParams(**SAMPLINGS[name])
    prompt, output = range(CONTEXT // 2), range(CONTEXT // 2, CONTEXT)
    batch = [SamplingRow(params, prompt, output, make_generator(i, device), (0,))
             for i in range(rows)]
    logits = torch.randn(rows, vocab, device=device, dtype=torch.bfloat16,
                         generator=make_generator(rows, device)).to(dtype)
    history = None
    if params.frequency_penalty or params.repetition_penalty != 1.0:
        # as engine/core/token_counts.py keeps them: counts and the prompt mask on the device
        counts = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
        counts[:, CONTEXT // 2:CONTEXT] = 1
        mask = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
        mask[:, :CONTEXT // 2] = True
        history = (counts, mask if params.repetition_penalty != 1.0 else None)
    sampler = Sampler(group_elements)
    first = sampler.sample(logits, batch, history).sampled_token_ids.tolist()     # warm-up
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sampler.sample(logits, batch, history).sampled_token_ids.cpu()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() - start if cuda else 0
    gpu = None
    if cuda:
        runs = [device_seconds(lambda: sampler.sample(logits, batch, history))
                for _ in range(repeats)]
        gpu = statistics.median(runs) if None not in runs else None
    return statistics.median(times), gpu, peak, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="16,64,256")
    ap.add_argument("--groups", default="24,23,22", help="log2 of the group's elements")
    ap.add_argument("--samplings", default=",".join(SAMPLINGS))
    ap.add_argument("--logits-dtypes", default="bfloat16",
                    help="the model's logits: bfloat16 (GLM's), float32 (the same values; top-p "
                         "then sorts float32 keys, as it does after a penalty)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    device = torch.device("cpu" if args.smoke else "cuda")
    vocab = 4_096 if args.smoke else VOCAB
    rows_list = [4, 8] if args.smoke else [int(r) for r in args.rows.split(",")]
    dtypes = "bfloat16,float32" if args.smoke else args.logits_dtypes
    if not args.smoke:
        print(torch.cuda.get_device_name(), "| torch", torch.__version__, flush=True)
    for rows in rows_list:
        for name in args.samplings.split(","):
            reference = None
            for dtype, g in ((d, int(g)) for d in dtypes.split(",")
                             for g in args.groups.split(",")):
                # the smoke's groups: 2^(g - 22) rows
                elements = (1 << g) if not args.smoke else vocab * (1 << (g - 22))
                seconds, gpu, peak, tokens = case(device, rows, vocab, name, elements,
                                                  getattr(torch, dtype),
                                                  2 if args.smoke else args.repeats)
                reference = reference or tokens
                print(json.dumps(dict(rows=rows, sampling=name, logits=dtype, group_log2=g,
                                      group_rows=max(1, elements // vocab),
                                      ms=round(seconds * 1e3, 3),
                                      gpu_ms=round(gpu * 1e3, 3) if gpu is not None else None,
                                      peak_mib=round(peak / 2**20, 1),
                                      same_tokens=tokens == reference)), flush=True)


if __name__ == "__main__":
    main()

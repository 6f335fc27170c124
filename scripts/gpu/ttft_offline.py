"""One phone agent's time to first token in the engine alone, against the GPU's busy time (GPU).

    python3 scripts/gpu/ttft_offline.py [--steps 8] [--min-chunk-before-image 0,256]
    python3 scripts/gpu/ttft_offline.py --smoke     # CPU, a tiny GLM-4.1V (checks the script)

AutoGLM-Phone-9B with random weights, offline (no HTTP, no image decoding: the prompt is
prepared before the clock starts): an episode of --steps turns, each a new 1080x2400 screenshot
after the cached history, a token sampled with Open-AutoGLM's sampling. Each value of
--min-chunk-before-image (engine/core/scheduler.py's MIN_CHUNK_BEFORE_IMAGE; default: the
scheduler's own) gets its own screenshot at every turn, the variants alternating which goes
first, so all see the same history. Prints each variant's median TTFT, then, for one more turn
each under torch.profiler, the GPU's kernel time against the wall, its idle gaps, and the
kernels that took the most.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import autoglm_serve.engine.core.scheduler as scheduler  # noqa: E402
from autoglm_serve import LLM, SamplingParams  # noqa: E402
from autoglm_serve.bench.phone_agent import PhoneEpisode, TASKS  # noqa: E402
from autoglm_serve.bench.screenshots import screenshot_png_base64  # noqa: E402
from engine_figures import kernel_busy_time  # noqa: E402

REPLY = '<think>ok</think><answer>do(action="Back")</answer>' * 3


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_to_first_token(llm: LLM, messages: list, min_chunk: int) -> tuple[float, int]:
    """Milliseconds from add_request to the sampled token, and the engine steps taken."""
    engine = llm.engine
    scheduler.MIN_CHUNK_BEFORE_IMAGE = min_chunk
    prompt = engine.frontend.prepare_chat(messages)
    params = SamplingParams(temperature=0, top_p=0.85, frequency_penalty=0.2, max_tokens=1)
    synchronize()
    start, steps = time.perf_counter(), 0
    engine.add_request(engine.frontend.next_request_id(), prompt, params, final_only=True)
    while engine.has_unfinished():
        engine.step()
        steps += 1
    synchronize()
    return 1e3 * (time.perf_counter() - start), steps


def turn(episode: PhoneEpisode, step: int, seed: int) -> list:
    """The messages of this turn with a screenshot of its own, the episode left as it was."""
    return copy.deepcopy(episode).add_screen(step, screenshot_png_base64(seed, 0, step))


def profiled(llm: LLM, messages: list, min_chunk: int) -> None:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall, _ = time_to_first_token(llm, messages, min_chunk)
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type.name == "CUDA")
    if not kernels:
        print(f"\nmin chunk {min_chunk}, profiled: wall {wall:.1f} ms, no GPU kernels")
        return
    busy, idle = kernel_busy_time(kernels)
    span = kernels[-1][1] - kernels[0][0]
    print(f"\nmin chunk {min_chunk}, profiled: wall {wall:.1f} ms, first kernel to last "
          f"{span / 1e3:.1f} ms, GPU busy {busy / 1e3:.1f} ms; idle gaps over 50 us: "
          f"{sum(g for g in idle if g > 50) / 1e3:.1f} ms in {sum(g > 50 for g in idle)}")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12,
                                    max_name_column_width=48))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--min-chunk-before-image", default=str(scheduler.MIN_CHUNK_BEFORE_IMAGE),
                    help="comma-separated values to compare")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    variants = [int(v) for v in args.min_chunk_before_image.split(",")]
    if args.smoke:
        import tempfile
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from glm4v_fixtures import make_tiny_glm4v
        path = make_tiny_glm4v(os.path.join(tempfile.mkdtemp(), "tiny-glm4v"))
        llm = LLM(str(path), max_model_len=4096, mm_processor_kwargs={"max_pixels": 60_000})
        args.steps = 2
    else:
        # the server's step budget (the offline API's default is larger on a GPU)
        llm = LLM("autoglm-phone-9b", load_format="dummy", dtype="bfloat16", max_model_len=25480,
                  mm_processor_kwargs={"max_pixels": 5_000_000},
                  limit_mm_per_prompt={"image": 10}, max_num_batched_tokens=2048)
    episode = PhoneEpisode(0, TASKS[0])
    times: dict[int, list[float]] = {v: [] for v in variants}
    steps: dict[int, int] = {}
    for step in range(args.steps):
        order = variants if step % 2 == 0 else variants[::-1]
        for v in order:
            ms, steps[v] = time_to_first_token(llm, turn(episode, step, 100 + variants.index(v)), v)
            if step:        # the first turn compiles and caches the system prompt
                times[v].append(ms)
        episode.add_screen(step, screenshot_png_base64(99, 0, step))
        episode.add_reply(REPLY)
    for v in variants:
        print(f"min chunk before an image {v}: TTFT median {statistics.median(times[v]):.1f} ms "
              f"({', '.join(f'{t:.1f}' for t in times[v])}), {steps[v]} engine steps")
    for v in variants:
        profiled(llm, turn(episode, args.steps, 200 + variants.index(v)), v)


if __name__ == "__main__":
    main()

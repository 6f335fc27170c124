"""Host (Python) time per engine step with hundreds of requests decoding together, by phase.

The model is a tiny random Llama (tests/tiny_llama.py) on the CPU, so its forward is cheap and
what is left of a step is the engine's own bookkeeping: the part that must stay well under the
GPU's decode step (~18.6 ms at 512 rows on an H200) for async scheduling to hide it.

    OMP_NUM_THREADS=1 python scripts/host_step_profile.py [--model glm4v|llama] [--rows 512]
        [--prompt-len 480 512] [--max-tokens 96] [--delta] [--repeats 3] [--cprofile]

Only steps where all ``--rows`` requests decode count. Phases (ms per step, median over the
steps of the best repeat):
  schedule       Scheduler.schedule
  prepare_host   runner inputs on the host (numpy)
  device_inputs  host arrays -> tensors and attention metadata (CPU path)
  launch_other   the rest of ModelRunner.launch: sampling choice, bookkeeping of the step
  after_launch   Scheduler.update_after_launch
  complete       EngineCore._complete: landing tokens, stop checks, CoreOutputs
  output_proc    OutputProcessor.process: detokenization, RequestOutputs
  gc             Python's garbage collector (inside the phases above)
  host           the step minus the model forward (the sum of the above and glue)
  host_mean      the same, mean over the steps (rare costs: a garbage collection, new blocks)
  pickle         pickle.dumps of the step's CoreOutputs (what a core process sends; not in host)
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pickle
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from autoglm_serve.engine.stats import GcTimer  # noqa: E402

PHASES = ["schedule", "prepare_host", "device_inputs", "launch_other", "after_launch",
          "complete", "output_proc"]


class PhaseClock:
    """Wraps methods on instances so that their time in the current step is summed per phase."""

    def __init__(self):
        self.now: dict[str, float] = defaultdict(float)
        self.gc = GcTimer()

    def wrap(self, obj, method: str, phase: str) -> None:
        inner = getattr(obj, method)

        @functools.wraps(inner)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.now[phase] += time.perf_counter() - start
        setattr(obj, method, timed)

    def take(self) -> dict[str, float]:
        step, self.now = dict(self.now), defaultdict(float)
        step["gc"] = self.gc.take()
        return step


class Recorder:
    """Keeps what a method returned last (the step's schedule, the core's outputs)."""

    def __init__(self, obj, method: str):
        self.last = None
        inner = getattr(obj, method)

        def recorded(*args, **kwargs):
            self.last = inner(*args, **kwargs)
            return self.last
        setattr(obj, method, recorded)


def build_engine(model: str, tmp: Path, rows: int, max_model_len: int):
    """A tiny random model: GLM-4.1V (the served model's code path: M-RoPE, encoder cache, GLM
    byte-level tokenizer) or Llama. Its attention returns the query: the PyTorch reference
    backend's padded decode attention takes ~0.4 s a step at 512 rows x 500 tokens on a CPU,
    and the host's work does not depend on what attention computes."""
    from autoglm_serve import LLM
    from autoglm_serve.models.layers.attention import AttentionBackend

    class QueryAsOutput(AttentionBackend):
        name = "query-as-output"

        def forward(self, q, k, v, kv_cache, meta, scale):
            return q
    if model == "glm4v":
        from tests.glm4v_fixtures import make_tiny_glm4v
        path = make_tiny_glm4v(tmp / "glm4v")
    else:
        from tests.tiny_llama import build_tiny_llama
        path = build_tiny_llama(tmp / "llama")
    llm = LLM(str(path), device="cpu", max_num_seqs=rows, max_num_batched_tokens=8192,
              max_model_len=max_model_len, kv_cache_memory_gib=1.0)
    llm.engine.core.runner.backend = QueryAsOutput()
    return llm.engine


def instrument(engine, clock: PhaseClock) -> tuple[Recorder, Recorder]:
    """Phase clocks on the engine's parts; returns recorders of the schedules and CoreOutputs."""
    core = engine.core
    runner = core.runner
    schedules, core_outputs = Recorder(core.scheduler, "schedule"), Recorder(core, "step")
    clock.wrap(core.scheduler, "schedule", "schedule")
    clock.wrap(core.scheduler, "update_after_launch", "after_launch")
    clock.wrap(runner, "prepare_host", "prepare_host")
    clock.wrap(runner, "device_inputs", "device_inputs")
    clock.wrap(runner, "launch", "launch")
    clock.wrap(runner.model, "forward", "forward")
    clock.wrap(runner.model, "compute_logits", "forward")
    clock.wrap(core, "_complete", "complete")
    clock.wrap(engine.frontend.output_processor, "process", "output_proc")
    return schedules, core_outputs


def run_once(engine, clock: PhaseClock, recorders: tuple[Recorder, Recorder], rows: int,
             prompt_len: tuple[int, int], max_tokens: int, delta: bool,
             profiler: cProfile.Profile | None = None) -> list[dict[str, float]]:
    """Adds ``rows`` requests, steps them to the end; per-phase seconds of the steps that
    launched ``rows`` decodes and completed ``rows`` tokens."""
    import random

    from autoglm_serve import SamplingParams
    engine.core.kv.reset_prefix_cache()    # each run prefills its prompts: same work each time
    rng = random.Random(0)
    vocab = min(engine.frontend.vocab_size, 128)     # plain words / ASCII bytes in both tokenizers
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for _ in range(rows):
        ids = [rng.randrange(7, vocab) for _ in range(rng.randint(*prompt_len))]
        engine.add_request(engine.frontend.next_request_id(), engine.frontend.prepare(ids), params,
                           delta=delta, final_only=not delta)
    schedules, core_outputs = recorders
    steps = []
    while engine.has_unfinished():
        clock.take()
        if profiler is not None:
            profiler.enable()
        start = time.perf_counter()
        engine.step()
        total = time.perf_counter() - start
        if profiler is not None:
            profiler.disable()
        phases = clock.take()
        scheduled = schedules.last.scheduled
        if not (len(scheduled) == rows and len(core_outputs.last) == rows
                and all(s.num_new_tokens == 1 for s in scheduled)):
            continue
        phases["total"] = total
        phases["host"] = total - phases.get("forward", 0.0)
        phases["launch_other"] = (phases.get("launch", 0.0) - phases.get("forward", 0.0)
                                  - phases.get("prepare_host", 0.0)
                                  - phases.get("device_inputs", 0.0))
        start = time.perf_counter()
        pickle.dumps(core_outputs.last, protocol=pickle.HIGHEST_PROTOCOL)
        phases["pickle"] = time.perf_counter() - start
        steps.append(phases)
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--model", choices=["glm4v", "llama"], default="glm4v")
    ap.add_argument("--prompt-len", type=int, nargs=2, default=[480, 512], metavar=("MIN", "MAX"))
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--delta", action="store_true",
                    help="an output per request every step (streaming, the benchmark driver), "
                         "not only at the end (LLM.generate)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cprofile", action="store_true", help="print the top functions too")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with tempfile.TemporaryDirectory() as tmp:
        engine = build_engine(args.model, Path(tmp), args.rows,
                              args.prompt_len[1] + args.max_tokens + 16)
    clock = PhaseClock()
    recorders = instrument(engine, clock)
    run_once(engine, clock, recorders, 8, (16, 32), 4, args.delta)      # warm-up
    best = None
    for _ in range(args.repeats):
        # profiled apart: cProfile's overhead would inflate the timed runs
        steps = run_once(engine, clock, recorders, args.rows, args.prompt_len, args.max_tokens,
                         args.delta)
        med = {k: statistics.median(s.get(k, 0.0) for s in steps) for k in steps[0]}
        med["host_mean"] = statistics.fmean(s["host"] for s in steps)
        if best is None or med["host"] < best["host"]:
            best, n_steps = med, len(steps)
    print(f"{args.rows} rows decoding, {n_steps} full-decode steps, median ms per step "
          f"(best of {args.repeats} runs):")
    for k in PHASES + ["gc", "forward", "host", "host_mean", "pickle"]:
        print(f"  {k:14s} {best.get(k, 0.0) * 1e3:7.2f}")
    if args.cprofile:
        profiler = cProfile.Profile()
        run_once(engine, clock, recorders, args.rows, args.prompt_len, args.max_tokens,
                 args.delta, profiler)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()

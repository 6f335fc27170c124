"""Offline decode of the embedded default with 1 thread, 2 threads (OMP_NUM_THREADS) and the
engine's adaptive count (engine/core/cpu_threads.py), on the machine as found and next to a busy
process, in alternating rounds (other processes on a shared CPU skew whichever run they meet).

    python scripts/bench_cpu_threads.py [--rounds 2] [--timeout 150]

Prints one markdown row per run: output tok/s at 1 stream (48 tokens) and 16 streams (16 x 32),
the threads the engine ended with, how often it changed them, and the load averages after.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN = """
import logging, os, time, torch
from autoglm_serve import LLM, SamplingParams
changes = []
decisions = logging.getLogger("autoglm_serve.engine.core.cpu_threads")
decisions.setLevel(logging.DEBUG)
decisions.addHandler(type("Count", (logging.Handler,), {"emit": lambda h, r: changes.append(r)})())
llm = LLM(max_model_len=1024)
prompts = [llm.tokenizer.encode(f"Tell me a long story about item number {i}.") for i in range(16)]
llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))
rates = []
for n, new in ((1, 48), (16, 32)):
    start = time.perf_counter()
    llm.generate(prompts[:n], SamplingParams(temperature=0, max_tokens=new, ignore_eos=True))
    rates.append(n * new / (time.perf_counter() - start))
print(f"{rates[0]:.1f} {rates[1]:.1f} {torch.get_num_threads()} {len(changes)}")
"""

MODES = {"1 thread": {"OMP_NUM_THREADS": "1"}, "2 threads": {"OMP_NUM_THREADS": "2"},
         "adaptive": {}}


def run(mode_env: dict[str, str], timeout: float) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", **mode_env)
    try:
        proc = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"over {timeout:.0f} s | - | - | -"
    if proc.returncode != 0:
        return "failed: " + proc.stderr.strip().splitlines()[-1]
    one, sixteen, threads, changes = proc.stdout.split()[-4:]
    return f"{one} | {sixteen} | {threads} | {changes}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=150)
    parser.add_argument("--modes", default=",".join(MODES), help="some of: " + ", ".join(MODES))
    parser.add_argument("--machines", default="as found,+ busy process")
    args = parser.parse_args()
    modes = {m: MODES[m] for m in args.modes.split(",")}
    print(f"{os.cpu_count()} CPUs")
    print("| round | machine | threads | tok/s, 1 stream | tok/s, 16 streams | threads at the end"
          " | changes | load 1/5/15 min |\n| --- | --- | --- | --- | --- | --- | --- | --- |",
          flush=True)
    for r in range(1, args.rounds + 1):
        for machine in args.machines.split(","):
            for mode, env in modes.items():
                neighbour = (subprocess.Popen([sys.executable, "-c", "while True: pass"])
                             if machine != "as found" else None)
                try:
                    time.sleep(0.2)
                    row = run(env, args.timeout)
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
                load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                print(f"| {r} | {machine} | {mode} | {row} | {load} |", flush=True)


if __name__ == "__main__":
    main()

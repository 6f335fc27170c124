"""The engine's CPU thread pool (engine/core/cpu_threads.py): other processes' CPU time read
from the real /proc, and the offline LLM giving a core back to a busy neighbour in a fresh
interpreter without OMP_NUM_THREADS, as a user's script runs it."""
from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import time

import torch

from autoglm_serve.engine.core.cpu_threads import (
    AdaptiveThreads, CpuReading, threads_for, usable_cores)
from tests.server_fixtures import ROOT


@contextlib.contextmanager
def busy_neighbour():
    """Another process that keeps one core busy (on this process's cores: it inherits them)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)     # started, not still importing
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_decision_gives_back_each_core_others_keep_busy():
    assert [threads_for(x, 2) for x in (0.0, 0.2, 0.3, 0.9, 1.5, 3.0)] == [2, 2, 1, 1, 1, 1]
    assert [threads_for(x, 16) for x in (0.0, 1.0, 3.5, 40.0)] == [16, 15, 12, 1]


def test_threads_shrink_at_once_and_grow_after_calm_windows():
    kept = torch.get_num_threads()
    try:
        pool = AdaptiveThreads()
        pool.cores, pool.threads = 2, 1
        assert [pool.decide(x) for x in (0.0, 0.9, 0.0)] == [1, 1, 1]    # calm, busy, calm
        assert pool.decide(0.1) == 2                                     # two calm in a row
        pool.threads = 2
        assert pool.decide(0.6) == 1
    finally:
        torch.set_num_threads(kept)


def test_a_busy_neighbour_reads_as_a_core_taken():
    cores = usable_cores()
    with busy_neighbour():
        before = CpuReading.now()
        time.sleep(1.0)
        others = CpuReading.now().others_cores(before)
    # at least the neighbour's core (whoever ran when it did not was also another process), and
    # never more than the cores there are: units and the set of cores read are right
    assert 0.7 <= others <= cores + 0.1, others
    assert threads_for(others, cores) <= max(1, cores - 1)


def test_own_cpu_time_is_part_of_the_busy_time_read():
    before = CpuReading.now()
    start = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    while resource.getrusage(resource.RUSAGE_SELF).ru_utime - start < 0.5:
        pass
    after = CpuReading.now()
    own = after.own_s - before.own_s
    assert own >= 0.5
    # ticks are 10 ms: the busy time of our cores holds ours, so it is not counted as others'
    assert after.busy_s - before.busy_s >= own - 0.05


def test_adjust_gives_a_core_back_to_a_neighbour():
    kept = torch.get_num_threads()
    try:
        pool = AdaptiveThreads()
        pool.threads = pool.cores           # as after a quiet spell
        torch.set_num_threads(pool.cores)
        with busy_neighbour():
            pool._last = CpuReading.now()
            time.sleep(0.6)
            pool.adjust()
        assert pool.threads <= max(1, pool.cores - 1)
        assert torch.get_num_threads() == pool.threads
    finally:
        torch.set_num_threads(kept)


SCRIPT = """
import os, subprocess, sys, time, torch
from autoglm_serve import LLM, SamplingParams
before = torch.get_num_threads()
llm = LLM(max_model_len=256, kv_cache_memory_gib=0.05)
pool = llm.engine.core.cpu_threads
if pool is not None:                 # as after a quiet spell: every core
    pool.threads = pool.cores
    torch.set_num_threads(pool.cores)
# a busy neighbour arrives (after the start-up, which it would only slow down)
neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
try:
    start = time.monotonic()
    while True:                      # long enough for the pool to decide (when there is one)
        out = llm.generate(["Hi"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        if pool is None or time.monotonic() - start > 1.5:
            break
finally:
    neighbour.kill()
print(before, torch.get_num_threads(), len(os.sched_getaffinity(0)),
      len(out[0].outputs[0].token_ids))
"""


def run(env_extra: dict[str, str]) -> list[int]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", **env_extra)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [int(x) for x in proc.stdout.split()[-4:]]


def test_a_window_spanning_an_idle_engine_is_dropped():
    kept = torch.get_num_threads()
    try:
        pool = AdaptiveThreads()
        pool.threads = pool.cores
        torch.set_num_threads(pool.cores)
        with busy_neighbour():
            stale = CpuReading.now()
            time.sleep(1.0)
            # the neighbour's second of a core, in a window just over the stale bound: a
            # decision on it would give a core back (>0.25 of one)
            pool._last = CpuReading(stale.busy_s, stale.own_s, stale.at - 1.2)
            assert CpuReading.now().others_cores(pool._last) > 0.3
            pool.adjust()
        assert pool.threads == pool.cores and pool._last.at > stale.at
    finally:
        torch.set_num_threads(kept)


def test_offline_llm_gives_a_core_back_to_a_busy_neighbour():
    before, after, cores, generated = run({})
    assert before == cores            # torch's own default: one thread per core
    assert after <= max(1, cores - 1) and generated == 8


def test_omp_num_threads_is_respected():
    before, after, cores, generated = run({"OMP_NUM_THREADS": "2"})
    assert before == after == 2 and generated == 8


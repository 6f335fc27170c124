"""Every entry point sizes torch's CPU pool alike (engine/core/cpu_threads.py): the offline LLM
here, in a fresh interpreter without OMP_NUM_THREADS, as a user's script runs it."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.server_fixtures import ROOT

SCRIPT = """
import os, torch
from autoglm_serve import LLM, SamplingParams
before = torch.get_num_threads()
llm = LLM(max_model_len=256, kv_cache_memory_gib=0.05)
out = llm.generate(["Hi"], SamplingParams(max_tokens=2, temperature=0))
print(before, torch.get_num_threads(), len(os.sched_getaffinity(0)), len(out[0].outputs[0].token_ids))
"""


def run(env_extra: dict[str, str]) -> list[int]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", **env_extra)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [int(x) for x in proc.stdout.split()[-4:]]


def test_offline_llm_leaves_a_core_free():
    before, after, cores, generated = run({})
    assert before == cores            # torch's own default: one thread per core
    assert after == max(1, cores - 1) and generated == 2


def test_omp_num_threads_is_respected(monkeypatch):
    import torch

    from autoglm_serve.engine.core.cpu_threads import size_cpu_threads
    kept = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", str(kept))
    torch.set_num_threads(kept + 1)
    try:
        size_cpu_threads(torch.device("cpu"))
        assert torch.get_num_threads() == kept + 1    # the user's setting stands
    finally:
        torch.set_num_threads(kept)

"""Prefix-cache hit rate of the same conversations on one `serve` process, on a 2-replica
`autoglm-serve cluster` with the affinity router, and on one with Ray Serve's default
(power-of-two) router, side by side. CPU is enough (embedded default model):

    OMP_NUM_THREADS=1 python scripts/cluster_prefix_affinity.py [--conversations 12 --turns 3
        --replicas 2 --no-system-prompt]

Prints one line per setup and exits 1 if affinity is below 90% of one server or below twice
the random router's rate. Ray's default router (power-of-two, the less loaded replica) keeps
closed-loop conversations in place by itself: the replica that just answered a turn is the
less loaded one when the next turn comes. A long system prompt shared by all conversations is a hit for any
router once each replica has seen it, which caps what affinity can gain over random routing
(with 2 replicas and 3 turns, about 1.1x; with 4 replicas and no system prompt, ~2.5x); --no-system-prompt measures the history alone."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoglm_serve.bench.conversations import (SYSTEM_PROMPT, prefix_counters,  # noqa: E402
                                               run_conversations)
from autoglm_serve.bench.server_process import ServerProcess, free_port  # noqa: E402

MODEL = "smol"
ENGINE = ["--max-model-len", "1024", "--kv-cache-memory-gib", "0.25", "--served-model-name",
          MODEL, "--no-engine-process", "--max-num-seqs", "16"]
CLUSTER = ["--replica-cpus", "0.5", "--replica-stats-period-s", "0.5"]


def wait_replicas(server: ServerProcess, n: int) -> None:
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        httpx.get(server.url("/health"), timeout=60)   # the router reports once it routed
        text = httpx.get(server.url("/metrics"), timeout=30).text
        if text.count("autoglm:replica_info{") >= n:
            return
        time.sleep(1)
    raise RuntimeError(f"fewer than {n} replicas after 600 s")


def measure(name: str, argv: list[str], a: argparse.Namespace) -> float:
    port = free_port()
    cmd = [sys.executable, "-m", "autoglm_serve.cli", *argv, "--host", "127.0.0.1",
           "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    server = ServerProcess(cmd, port, tempfile.mkstemp(suffix=".log")[1], env=env, cwd=ROOT)
    server.start(600)
    try:
        if "cluster" in argv:   # /health answers once one replica is up: wait for all
            wait_replicas(server, a.replicas)
        run = run_conversations(server.base_url, MODEL, a.conversations, a.turns, seed=7,
                                system_prompt="" if a.no_system_prompt else SYSTEM_PROMPT)
        assert set(run.statuses) == {200}, run.statuses
        expected = a.conversations * a.turns
        deadline = time.monotonic() + 120
        while True:   # a cluster's replicas report their counters every 0.5 s
            text = httpx.get(server.url("/metrics"), timeout=30).text
            finished = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                           if line.startswith("vllm:request_success_total"))
            if finished >= expected:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"/metrics shows {finished} of {expected} requests")
            time.sleep(0.5)
        hits, queries = prefix_counters(text)
        stays = sum(len(set(t)) == 1 for t in run.replicas)
        used = len({r for t in run.replicas for r in t})
        print(f"{name:28s} hit rate {hits / queries:.3f}  ({hits:.0f}/{queries:.0f} tokens; "
              f"conversations on one replica: {stays}/{a.conversations}; replicas used: {used})", flush=True)
        return hits / queries
    finally:
        server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=12)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--no-system-prompt", action="store_true")
    a = p.parse_args()
    cluster = ["cluster", *ENGINE, *CLUSTER, "--replicas", str(a.replicas)]
    one = measure("one serve process", ["serve", *ENGINE], a)
    affinity = measure("cluster, affinity router", cluster, a)
    random = measure("cluster, random router", cluster + ["--request-router", "random"], a)
    pow2 = measure("cluster, power-of-two router",
                   cluster + ["--request-router", "power-of-two"], a)
    print(f"affinity / one server = {affinity / one:.2f} (>= 0.9); "
          f"affinity / random = {affinity / random:.2f} (>= 2); "
          f"affinity / power-of-two = {affinity / pow2:.2f}")
    return 0 if affinity >= 0.9 * one and affinity >= 2 * random else 1


if __name__ == "__main__":
    sys.exit(main())

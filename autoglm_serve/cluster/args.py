"""Flags of `autoglm-serve cluster`: every `serve` flag (each replica is built from them, as
`serve` builds its engine), plus how many replicas, where they run and how they are routed."""
from __future__ import annotations

import argparse

from autoglm_serve.server.args import add_serve_args

ROUTERS = {
    "affinity": "autoglm_serve.cluster.router.ConversationAffinityRouter",
    # Ray Serve's default: two random replicas, the less loaded one (no prefix awareness)
    "power-of-two": "autoglm_serve.cluster.router.PowerOfTwoRouter",
    "random": "autoglm_serve.cluster.router.RandomRouter",   # a baseline for benchmarks
}


def add_cluster_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_serve_args(p)
    c = p.add_argument_group("cluster (Ray Serve)")
    c.add_argument("--address", default=None,
                   help="join this Ray cluster (e.g. ray://head:10001 or auto); default: start "
                        "a local one")
    c.add_argument("--replicas", type=int, default=None,
                   help="engine replicas (default 1; when autoscaling: the initial number, "
                        "default --min-replicas)")
    c.add_argument("--min-replicas", type=int, default=None,
                   help="autoscale on ongoing requests, down to this many replicas")
    c.add_argument("--max-replicas", type=int, default=None,
                   help="autoscale on ongoing requests, up to this many replicas")
    c.add_argument("--target-ongoing-requests", type=float, default=None,
                   help="autoscaling aims at this many requests in flight per replica "
                        "(default: max-num-seqs / 2)")
    c.add_argument("--upscale-delay-s", type=float, default=30.0)
    c.add_argument("--downscale-delay-s", type=float, default=600.0)
    c.add_argument("--autoscaling-look-back-s", type=float, default=30.0,
                   help="the window over which ongoing requests are averaged")
    c.add_argument("--max-ongoing-requests", type=int, default=None,
                   help="requests one replica takes at once; more wait in Ray Serve's router "
                        "(default: max-num-seqs + max-waiting-requests)")
    c.add_argument("--replica-cpus", type=float, default=1.0,
                   help="CPUs Ray reserves for each replica (fractions allowed)")
    c.add_argument("--replica-gpus", type=float, default=None,
                   help="GPUs of each replica (default: --tensor-parallel-size when the Ray "
                        "cluster has GPUs and --device is not cpu, else 0)")
    c.add_argument("--request-router", default="affinity", choices=sorted(ROUTERS),
                   help="affinity: a conversation stays on the replica holding its prefix; "
                        "power-of-two: Ray Serve's default; random: a baseline")
    c.add_argument("--affinity-imbalance-threshold", type=int, default=8,
                   help="a conversation leaves its replica when that one has more than this "
                        "many requests in flight beyond the least loaded one")
    c.add_argument("--replica-stats-period-s", type=float, default=2.0,
                   help="how often each replica reports its metrics to the ingress's /metrics")
    c.add_argument("--health-check-period-s", type=float, default=5.0)
    return p


def _bounds(args: argparse.Namespace) -> tuple[int, int, int]:
    """min, initial, max replicas."""
    lo = args.min_replicas if args.min_replicas is not None else 1
    initial = args.replicas if args.replicas is not None else lo
    hi = args.max_replicas if args.max_replicas is not None else max(lo, initial)
    return lo, initial, hi


def check_cluster_args(args: argparse.Namespace) -> None:
    if args.replicas is not None and args.replicas < 1:
        raise ValueError("--replicas must be >= 1")
    lo, initial, hi = _bounds(args)
    if autoscaling(args) and not 1 <= lo <= initial <= hi:
        raise ValueError(f"autoscaling needs 1 <= --min-replicas ({lo}) <= --replicas "
                         f"({initial}) <= --max-replicas ({hi})")
    if args.replica_cpus < 0 or (args.replica_gpus or 0) < 0:
        raise ValueError("--replica-cpus and --replica-gpus must be >= 0")


def autoscaling(args: argparse.Namespace) -> bool:
    return args.min_replicas is not None or args.max_replicas is not None


def autoscaling_config(args: argparse.Namespace) -> dict:
    lo, initial, hi = _bounds(args)
    return {"min_replicas": lo, "initial_replicas": initial, "max_replicas": hi,
            "target_ongoing_requests": args.target_ongoing_requests
            or max(1.0, args.max_num_seqs / 2),
            "upscale_delay_s": args.upscale_delay_s,
            "downscale_delay_s": args.downscale_delay_s,
            "look_back_period_s": args.autoscaling_look_back_s}


def num_replicas(args: argparse.Namespace) -> int:
    return _bounds(args)[1]


def build_parser(prog: str = "autoglm-serve cluster") -> argparse.ArgumentParser:
    return add_cluster_args(argparse.ArgumentParser(
        prog=prog, description="engine replicas on Ray Serve behind one OpenAI endpoint",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter))

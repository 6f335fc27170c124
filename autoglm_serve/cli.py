"""The `autoglm-serve` command: `serve` (the OpenAI-compatible server), `quantize` (with
compressed-tensors installed), plus `bench` and `tune` when the benchmark package is present."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from autoglm_serve.server.args import add_serve_args

    parser = argparse.ArgumentParser(prog="autoglm-serve")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the OpenAI-compatible server (vLLM's flags)",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_serve_args(serve)
    serve.set_defaults(func=_serve)
    cluster = sub.add_parser("cluster", help="engine replicas on Ray Serve behind one "
                             "OpenAI endpoint (needs ray[serve])",
                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    from autoglm_serve.cluster.args import add_cluster_args
    add_cluster_args(cluster)
    cluster.set_defaults(func=_cluster)
    try:
        from autoglm_serve.quantize.command import add_quantize_subcommand
    except ImportError:   # compressed-tensors not installed: serving does not need it
        pass
    else:
        add_quantize_subcommand(sub)
    try:
        from autoglm_serve.bench.cli import add_bench_subcommands, add_tune_subcommand
    except ImportError:   # a build without the benchmark tools still serves
        pass
    else:
        add_bench_subcommands(sub)
        add_tune_subcommand(sub)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from autoglm_serve.server.launch import run_server
    return run_server(args)


def _cluster(args: argparse.Namespace) -> int:
    from autoglm_serve.cluster.launch import run_cluster
    return run_cluster(args)


def main(argv: list[str] | None = None) -> int:
    from autoglm_serve.server.args import normalize_argv

    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

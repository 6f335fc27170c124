"""The `autoglm-serve` command: `serve` (the OpenAI-compatible server), `doctor` (is this machine
ready to serve), `cluster` (replicas on Ray Serve), `quantize` (a compressed-tensors checkpoint), plus `bench`
and `tune` when the benchmark package is present."""
from __future__ import annotations

import argparse
import sys

from autoglm_serve.help_formatter import DefaultsHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    from autoglm_serve.server.args import add_serve_args

    import autoglm_serve
    from autoglm_serve.doctor import add_doctor_args

    parser = argparse.ArgumentParser(prog="autoglm-serve")
    parser.add_argument("--version", action="version",
                        version=f"autoglm-serve {autoglm_serve.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the OpenAI-compatible server (vLLM's flags)",
                           formatter_class=DefaultsHelpFormatter)
    add_serve_args(serve)
    serve.set_defaults(func=_serve)
    doctor = sub.add_parser("doctor", help="check Python, torch, CUDA, GPUs, Triton, the model "
                            "and the port, and say what to fix",
                            formatter_class=DefaultsHelpFormatter)
    add_doctor_args(doctor)
    doctor.set_defaults(func=_doctor)
    cluster = sub.add_parser("cluster", help="engine replicas on Ray Serve behind one "
                             "OpenAI endpoint (needs ray[serve])",
                             formatter_class=DefaultsHelpFormatter)
    from autoglm_serve.cluster.args import add_cluster_args
    add_cluster_args(cluster)
    cluster.set_defaults(func=_cluster)
    from autoglm_serve.quantize.command import add_quantize_subcommand
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


def _doctor(args: argparse.Namespace) -> int:
    from autoglm_serve.doctor import run_doctor
    return run_doctor(args)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        # parsed without the serve flags, whose module imports torch: doctor must still run,
        # and say so, where torch is missing
        from autoglm_serve.doctor import add_doctor_args
        parser = add_doctor_args(argparse.ArgumentParser(
            prog="autoglm-serve doctor", formatter_class=DefaultsHelpFormatter))
        return _doctor(parser.parse_args(argv[1:]))
    from autoglm_serve.server.args import normalize_argv

    argv = normalize_argv(argv)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        # Ctrl-C while a model loads or a client command runs: one line, not a traceback
        # (a serving server drains instead and exits 0); 130 is the shell's interrupted code
        print("autoglm-serve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`python -m autoglm_serve.entrypoints.openai.api_server [flags]`: the same server and flags as
`autoglm-serve serve`, under vLLM's module path (MODEL may also come as --model)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from autoglm_serve.server.args import build_parser, normalize_argv
    from autoglm_serve.server.launch import run_server

    parser = build_parser(prog="python -m autoglm_serve.entrypoints.openai.api_server")
    args = parser.parse_args(normalize_argv(list(sys.argv[1:] if argv is None else argv)))
    return run_server(args)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m autoglm_serve.launch_server [SGLang's flags]`: the server under SGLang's module
name, so a `python -m sglang.launch_server` deployment line starts after changing the module.

SGLang's flag names are mapped onto ours (the vLLM ones) where they mean the same; the rest
pass through unchanged (--served-model-name, --port, --host, --api-key, --chat-template, ...).
"""
from __future__ import annotations

import json
import sys

# SGLang's name → ours, for flags that take a value or none alike
RENAMES = {
    "--model-path": "--model",
    "--tokenizer-path": "--tokenizer",
    "--context-length": "--max-model-len",
    "--tp-size": "--tensor-parallel-size",
    "--tp": "--tensor-parallel-size",
    "--mem-fraction-static": "--gpu-memory-utilization",
    "--limit-mm-data-per-request": "--limit-mm-per-prompt",
    "--random-seed": "--seed",
}
# SGLang's data-parallel vision encoder is vLLM's --mm-encoder-tp-mode data (logged: no effect)
FLAG_AS = {"--mm-enable-dp-encoder": ["--mm-encoder-tp-mode", "data"]}


def _mm_process_config(value: str) -> list[str]:
    """'{"image": {"max_pixels": N}}' → --mm-processor-kwargs '{"max_pixels": N}' (the
    image processor's settings; this server takes no video or audio)."""
    try:
        config = json.loads(value)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: --mm-process-config is not valid JSON ({exc}): {value!r}")
    if not isinstance(config, dict) or not isinstance(config.get("image", {}), dict):
        raise SystemExit("error: --mm-process-config expects "
                         '\'{"image": {"max_pixels": ...}}\', got ' + repr(value))
    return ["--mm-processor-kwargs", json.dumps(config.get("image", {}))] if config else []


def translate(argv: list[str]) -> list[str]:
    """SGLang's command line → ours."""
    from autoglm_serve.server.args import normalize_argv

    out: list[str] = []
    args = iter(normalize_argv(argv))
    for arg in args:
        name, eq, value = arg.partition("=")
        if name == "--mm-process-config":
            out += _mm_process_config(value if eq else next(args, "{}"))
        elif name in FLAG_AS:
            out += FLAG_AS[name]
        elif name in RENAMES:
            out.append(RENAMES[name] + eq + value)
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    from autoglm_serve.server.args import build_parser
    from autoglm_serve.server.launch import run_server

    parser = build_parser(prog="python -m autoglm_serve.launch_server")
    args = parser.parse_args(translate(list(sys.argv[1:] if argv is None else argv)))
    return run_server(args)


if __name__ == "__main__":
    sys.exit(main())

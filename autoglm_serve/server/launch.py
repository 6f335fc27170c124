"""Starting the server: check the port, load the engine, print what was built, run uvicorn
(server/shutdown.py says how it stops: drained on SIGTERM, status 1 when the engine dies)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys

from autoglm_serve.server.args import (ServerSettings, engine_config_from_args, no_effect_notes,
                                       settings_from_args)

logger = logging.getLogger("autoglm_serve.server")


def bind_socket(host: str, port: int) -> socket.socket:
    """Bound before the (slow) model load, so a busy port fails in a second, not a minute."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # sockets that say so, and accepted ones copy the listener's. With it on, a stream's small
    # chunks waited for the client's delayed ACK: on a kept-alive connection (the OpenAI SDK's),
    # the first tokens came ~40 ms late, together.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}. Is another "
                         "server running there? Choose another --port.") from exc
    sock.set_inheritable(True)
    return sock


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def default_max_tokens_line(defaults: dict) -> str:
    limit = defaults.get("max_new_tokens")
    where = "up to max_model_len" if limit is None else str(limit)
    return (f"default max_tokens (requests without one): {where}    sampling defaults: "
            f"{ {k: v for k, v in defaults.items() if k != 'max_new_tokens'} or 'none'}    "
            "change with --override-generation-config '{\"max_new_tokens\": N}'")


def startup_report(engine, settings: ServerSettings, serving_defaults: dict) -> list[str]:
    info = engine.info
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    where = f"its own process (pid {info.core_pid})" if info.core_pid != os.getpid() \
        else "a thread of the server process"
    return [
        f"model: {info.model_path} ({info.model_class})",
        f"served model names: {', '.join(settings.served_model_names)}",
        f"device: {info.device}    dtype: {info.dtype}    engine core: {where}",
        f"weights: {_gib(info.weight_bytes)}    loaded in {info.load_seconds:.1f} s",
        f"quantization: {info.quantization}    KV cache dtype: {info.kv_cache_dtype}",
        f"KV cache: {info.kv_blocks} blocks x {info.kv_block_size} tokens = {info.kv_tokens} "
        f"tokens ({_gib(info.kv_bytes)})",
        f"max_model_len: {info.max_model_len}    maximum concurrency at max_model_len: "
        f"{info.kv_tokens / info.max_model_len:.2f}x    max_num_seqs: {info.max_num_seqs}",
        default_max_tokens_line(serving_defaults),
        f"API key: {'required' if settings.api_key else 'none'}    reasoning parser: "
        f"{settings.reasoning_parser or 'none (per request: return_reasoning)'}",
        f"serving on http://{host}:{settings.port}/v1 (listening on {settings.host})",
    ]


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO) if level != "trace"
                        else logging.DEBUG, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def _serve(engine, settings: ServerSettings, sock: socket.socket) -> None:
    import anyio
    import torch
    import uvicorn

    from autoglm_serve.server.app import build_app
    from autoglm_serve.server.gpu_stats import GpuStats
    from autoglm_serve.server.shutdown import DrainingServer

    device = torch.device(engine.info.device)
    gpu = GpuStats.open([device.index or 0]) if device.type == "cuda" else None
    app = build_app(engine, settings, gpu)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        engine.start()
        # anyio imports its asyncio backend at its first use, a streamed response's task group:
        # 12-16 ms of the first request's time to first token on a CI core, paid here instead
        await anyio.sleep(0)
        for line in startup_report(engine, settings, app.state.serving.defaults):
            logger.info(line)
        yield
        logger.info("shutting down the engine")
        engine.shutdown()

    app.router.lifespan_context = lifespan
    config = uvicorn.Config(app, log_level=settings.uvicorn_log_level,
                            access_log=settings.access_log, timeout_keep_alive=30,
                            log_config=None)
    # uvicorn re-raises a captured SIGTERM or SIGINT (Ctrl-C) after its graceful shutdown, where
    # asyncio.run's own SIGINT handler would turn the drained exit into a KeyboardInterrupt's
    # traceback; no-op handlers make that re-raise harmless, so a server that drained exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    await DrainingServer(config, engine, settings.graceful_shutdown_timeout).serve(
        sockets=[sock])


def run_server(args: argparse.Namespace) -> int:
    _configure_logging(args.uvicorn_log_level)
    try:
        config = engine_config_from_args(args)
        settings = settings_from_args(args)
        for note in no_effect_notes(args):
            logger.info("%s", note)
        sock = bind_socket(settings.host, settings.port)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from autoglm_serve.engine.async_llm import AsyncLLM
    from autoglm_serve.engine.process.core_client import EngineStartError
    logger.info("loading %s", config.model or "the embedded default model")
    try:
        # The server admits by its own exact count (Serving.admit); the engine's check reads
        # a waiting queue that may still hold just-aborted requests, so it is only a backstop.
        engine = AsyncLLM(config, max_waiting=2 * (config.max_num_seqs
                                                   + settings.max_waiting_requests) + 1,
                          core_process=args.engine_process)
    except (ValueError, FileNotFoundError, NotImplementedError, EngineStartError) as exc:
        print(f"error: cannot start the engine: {exc}", file=sys.stderr)
        sock.close()
        return 2
    if engine.tokenizer is None:
        print("error: the server needs a tokenizer", file=sys.stderr)
        engine.shutdown()
        sock.close()
        return 2
    # What start-up built (tokenizer, torch, the engine and, on a thread, the model) lives as
    # long as the server: out of the collector's sight, a full pass no longer walks it while
    # streams wait (as in the core process)
    gc.collect()
    gc.freeze()
    asyncio.run(_serve(engine, settings, sock))
    if engine.dead is not None:
        print(f"error: the engine core stopped: {engine.dead}", file=sys.stderr)
        return 1
    return 0

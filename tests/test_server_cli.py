"""The command line: vLLM's flags, startup errors that say what is wrong, the start-up report,
generation_config defaults, and graceful shutdown on SIGTERM and on a terminal's Ctrl-C (exit 0,
in-flight requests done)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from autoglm_serve.server.args import (build_parser, engine_config_from_args, normalize_argv,
                                       settings_from_args)
from tests.server_fixtures import ROOT, ServerProcess
from tests.tiny_llama import build_tiny_llama

# Open-AutoGLM's README line for vLLM, with the module renamed (underscored flags included).
OPEN_AUTOGLM_FLAGS = [
    "--served-model-name", "autoglm-phone-9b", "--allowed-local-media-path", "/",
    "--mm-encoder-tp-mode", "data", "--mm_processor_cache_type", "shm",
    "--mm_processor_kwargs", '{"max_pixels":5000000}', "--max-model-len", "25480",
    "--chat-template-content-format", "string", "--limit-mm-per-prompt", '{"image":10}',
    "--model", "zai-org/AutoGLM-Phone-9B", "--port", "8000"]


def parse(argv: list[str]):
    return build_parser().parse_args(normalize_argv(argv))


def test_vllm_deployment_line_maps_onto_engine_config():
    args = parse(OPEN_AUTOGLM_FLAGS)
    cfg = engine_config_from_args(args)
    settings = settings_from_args(args)
    assert cfg.model == "zai-org/AutoGLM-Phone-9B" and cfg.max_model_len == 25480
    assert cfg.mm_processor_kwargs == {"max_pixels": 5000000}
    assert cfg.limit_mm_per_prompt == {"image": 10}
    assert settings.served_model_names == ["autoglm-phone-9b"] and settings.port == 8000
    assert settings.allowed_local_media_path == "/" and settings.host == "0.0.0.0"


def test_flags_and_defaults():
    args = parse(["some/model", "--served-model-name", "a", "b", "--tensor-parallel-size", "1",
                  "--max-num-seqs", "64", "--max-num-batched-tokens", "4096",
                  "--no-enable-chunked-prefill", "--no-enable-prefix-caching",
                  "--gpu-memory-utilization", "0.8", "--dtype", "bfloat16", "--load-format",
                  "safetensors", "--api-key", "k", "--enforce-eager", "--trust-remote-code",
                  "--max-model-len", "32K", "--limit-mm-per-prompt", "image=2,video=0",
                  "--max-request-body-mb", "10", "--cudagraph-mode", "FULL_AND_PIECEWISE",
                  "--hf-overrides", '{"text_config": {"num_hidden_layers": 2}}'])
    cfg, s = engine_config_from_args(args), settings_from_args(args)
    assert (cfg.model, cfg.max_num_seqs, cfg.max_num_batched_tokens) == ("some/model", 64, 4096)
    assert not cfg.enable_chunked_prefill and not cfg.enable_prefix_caching
    assert cfg.gpu_memory_utilization == 0.8 and cfg.dtype == "bfloat16" and cfg.enforce_eager
    assert cfg.cudagraph_mode == "full_and_piecewise"   # vLLM's spelling, any case
    assert cfg.max_model_len == 32 * 1024 and cfg.limit_mm_per_prompt == {"image": 2, "video": 0}
    assert cfg.hf_overrides == {"text_config": {"num_hidden_layers": 2}}
    assert s.served_model_names == ["a", "b"] and s.api_key == "k"
    assert s.max_request_body_bytes == 10 * 2**20 and not s.access_log
    d = parse([])
    dc, ds = engine_config_from_args(d), settings_from_args(d)
    assert dc.model is None and dc.enable_chunked_prefill and dc.enable_prefix_caching
    assert dc.cudagraph_mode == "full_decode_only" and not dc.enforce_eager
    assert ds.served_model_names == ["SmolLM2-135M-Instruct"]
    assert (ds.host, ds.port, ds.max_request_body_bytes) == ("0.0.0.0", 8000, 50 * 2**20)


def _run_cli(args: list[str], module: str = "autoglm_serve.cli") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", module] + (["serve"] if module == "autoglm_serve.cli" else [])
    return subprocess.run(cmd + args, capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("args,message", [
    (["--quantization", "bitsandbytes"], "quantization='bitsandbytes' is not supported"),
    # the embedded model has no quantization_config: awq is refused once it is read
    (["--quantization", "awq"], "needs a checkpoint quantized with awq"),
    # the embedded SmolLM2's 9 heads and 3 KV heads split over 3 ranks, not 2
    (["--tensor-parallel-size", "2"], "tensor_parallel_size=2 does not divide its 9 attention"),
    (["--mm-encoder-tp-mode", "pixels"], "invalid choice"),
    (["--pipeline-parallel-size", "2"], "pipeline/data parallelism is not supported"),
    (["--chat-template", "/no/such/template.jinja"], "no such file"),
    (["a-model", "--model", "another-model"], "given twice"),
    (["--generation-config", "/x"], "--generation-config"),
    (["--override-generation-config", '{"beams": 4}'], "unsupported keys"),
    (["--load-format", "pt"], "load_format must be"),
    (["--allowed-local-media-path", "/no/such/dir"], "not a directory"),
])
def test_unsupported_values_are_startup_errors(args, message):
    r = _run_cli(args + ["--port", "1"])
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_busy_port_fails_before_loading_the_model():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.monotonic()
        r = _run_cli(["--host", "127.0.0.1", "--port", str(port)])
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr
    assert time.monotonic() - t0 < 60


def test_api_server_module_takes_the_same_flags():
    r = _run_cli(["--help"], module="autoglm_serve.entrypoints.openai.api_server")
    assert r.returncode == 0
    for flag in ("--served-model-name", "--max-num-seqs", "--enable-prefix-caching",
                 "--api-key", "--limit-mm-per-prompt", "--reasoning-parser"):
        assert flag in r.stdout
    r = _run_cli(["--quantization", "bnb"], module="autoglm_serve.entrypoints.openai.api_server")
    assert r.returncode == 2 and "not supported" in r.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    gen = json.loads((path / "generation_config.json").read_text())
    # The checkpoint's sampling defaults: greedy (top_k 1), which requests may override.
    (path / "generation_config.json").write_text(json.dumps({**gen, "temperature": 0.7,
                                                            "top_k": 1}))
    return path


@pytest.fixture(scope="module")
def tiny_server(tiny):
    server = ServerProcess(
        ["--model", str(tiny), "--served-model-name", "tiny", "--trust-remote-code",
         "--max-model-len", "1024", "--max-num-seqs", "8", "--enable-chunked-prefill",
         "--enable-prefix-caching", "--dtype", "float32", "--load-format", "safetensors",
         "--mm_processor_kwargs", '{"max_pixels": 5000000}', "--limit-mm-per-prompt",
         '{"image": 10}', "--kv-cache-memory-gib", "0.05", "--graceful-shutdown-timeout", "60",
         "--reasoning-parser", "glm45", "--trust-request-chat-template"],
        module="autoglm_serve.entrypoints.openai.api_server", subcommand=None)
    server.start()
    yield server
    server.stop()


def test_startup_report_and_models(tiny_server, tiny):
    log = tiny_server.log()
    for text in (f"model: {tiny}", "served model names: tiny", "device: cpu", "dtype: float32",
                 "weights: ", "KV cache: ", " blocks x 16 tokens = ", "max_model_len: 1024",
                 "maximum concurrency at max_model_len: ",
                 f"serving on http://127.0.0.1:{tiny_server.port}/v1"):
        assert text in log, text
    model = httpx.get(tiny_server.url("/v1/models")).json()["data"][0]
    assert model["id"] == "tiny" and model["max_model_len"] == 1024
    m = httpx.get(tiny_server.url("/metrics")).text
    assert 'max_model_len="1024"' in m and "autoglm:kv_cache_blocks" in m


def test_generation_config_defaults_and_request_overrides(tiny_server):
    def ask(**kw):
        r = httpx.post(tiny_server.url("/v1/chat/completions"), json={
            "model": "tiny", "messages": [{"role": "user", "content": "open the app"}],
            "max_tokens": 12, **kw}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    greedy = ask(temperature=0)
    # No sampling fields: the checkpoint's top_k=1 makes it greedy.
    assert ask() == greedy and ask(seed=1) == greedy
    # The request's top_k overrides it: sampling at temperature 1 differs across seeds.
    sampled = {ask(top_k=0, temperature=1.0, seed=s) for s in range(4)}
    assert len(sampled) > 1


def test_reasoning_parser_flag_splits_by_default(tiny_server):
    """--reasoning-parser glm45: reasoning is split unless the request says return_reasoning
    false. The template here leaves the prompt inside <think>."""
    template = ("{% for m in messages %}<|user|> {{ m['content'] }} {% endfor %}"
                "<|assistant|> <think>")

    def ask(**kw):
        r = httpx.post(tiny_server.url("/v1/chat/completions"), json={
            "model": "tiny", "messages": [{"role": "user", "content": "open the app"}],
            "max_tokens": 8, "temperature": 0, "chat_template": template, **kw}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]

    split, raw = ask(), ask(return_reasoning=False)
    assert raw["content"] and raw.get("reasoning_content") is None
    assert split["reasoning_content"] == raw["content"] and split["content"] == ""


def stop_mid_stream(server: ServerProcess, model: str, stop) -> None:
    """Calls ``stop()`` at a stream's third chunk; the stream must still end complete, no new
    connection be taken after it, and the server exit 0 without a traceback."""
    body = {"model": model, "messages": [{"role": "user", "content": "tap the home button"}],
            "max_tokens": 900, "stream": True}
    chunks, finish, done = 0, None, False
    with httpx.stream("POST", server.url("/v1/chat/completions"), json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks += 1
                finish = json.loads(line[6:])["choices"][0]["finish_reason"] or finish
                if chunks == 3:
                    stop()
                    time.sleep(0.3)
                    # No new connections once shutdown began.
                    with pytest.raises(httpx.HTTPError):
                        httpx.get(server.url("/health"), timeout=5)
    assert done and finish == "length" and chunks >= 900 // 2
    assert server.proc.wait(60) == 0
    assert "Traceback" not in server.log(10**6)


def test_sigterm_finishes_in_flight_streams_and_exits_0(tiny_server):
    stop_mid_stream(tiny_server, "tiny", lambda: tiny_server.proc.send_signal(signal.SIGTERM))


def test_a_second_ctrl_c_ends_streams_with_an_error_event_at_once(tiny):
    """uvicorn's forced exit: no waiting out the drain, but each stream still ends readably (an
    error event, then [DONE]), the engine is shut down, and no cancelled task's traceback."""
    server = ServerProcess(["--model", str(tiny), "--served-model-name", "tiny",
                            "--max-model-len", "1024", "--dtype", "float32",
                            "--kv-cache-memory-gib", "0.05", "--graceful-shutdown-timeout", "60"])
    server.start()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "tap the home button"}],
            "max_tokens": 1000, "stream": True, "ignore_eos": True}
    events = []
    try:
        with httpx.stream("POST", server.url("/v1/chat/completions"), json=body,
                          timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue    # the blank line after each event: two Ctrl-Cs, not four
                events.append(line[6:])
                if len(events) == 3:
                    os.killpg(server.proc.pid, signal.SIGINT)
                    time.sleep(0.5)
                    stopped_at = time.monotonic()
                    os.killpg(server.proc.pid, signal.SIGINT)
        assert events[-1] == "[DONE]" and len(events) < 1000
        assert "shutting down" in json.loads(events[-2])["error"]["message"]
        code = server.proc.wait(30)
        log = server.log(10**6)
        assert code == 0 and time.monotonic() - stopped_at < 20, log[-3000:]
        assert "Traceback" not in log and "shutting down the engine" in log
    finally:
        server.stop()


def test_ctrl_c_while_the_model_loads_exits_130_without_a_traceback(tiny):
    server = ServerProcess(["--model", str(tiny), "--max-model-len", "1024", "--dtype",
                            "float32", "--kv-cache-memory-gib", "0.05"])
    server.spawn()
    try:
        deadline = time.monotonic() + 60
        while "loading " not in server.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "loading " in server.log()
        os.killpg(server.proc.pid, signal.SIGINT)
        assert server.proc.wait(60) == 130
        log = server.log(10**6)
        assert "interrupted" in log and "Traceback" not in log and "serving on" not in log
        deadline = time.monotonic() + 20     # the engine core it was starting goes too
        while server.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not server.processes()
    finally:
        server.stop()


def test_ctrl_c_finishes_in_flight_streams_and_exits_0(tiny):
    """A terminal's Ctrl-C sends SIGINT to the whole process group (the server and its engine
    core): uvicorn drains, and the re-raised SIGINT must not end in a KeyboardInterrupt."""
    server = ServerProcess(["--model", str(tiny), "--served-model-name", "tiny",
                            "--max-model-len", "1024", "--dtype", "float32",
                            "--kv-cache-memory-gib", "0.05", "--graceful-shutdown-timeout", "60"])
    server.start()
    try:
        stop_mid_stream(server, "tiny", lambda: os.killpg(server.proc.pid, signal.SIGINT))
    finally:
        server.stop()

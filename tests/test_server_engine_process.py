"""The engine core in its own process (the default) and on a thread (--no-engine-process): the
core's pid, a stream that lags the engine still equals the non-streamed answer, a killed core
ends the streams and the server (exit 1), SIGTERM drains and then ends what is left with an
error event, a core that cannot start fails the server's start with its reason, a stopped
server leaves no process behind, and the engine logs its pace."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.server_fixtures import (ROOT, ServerProcess, free_port, processes_with_marker,
                                  server_fixture, wait_gone)
from tests.tiny_llama import build_tiny_llama

MAX_LEN = 1024


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def server_args(tiny, *extra: str) -> list[str]:
    return [str(tiny), "--served-model-name", "tiny", "--max-model-len", str(MAX_LEN),
            "--dtype", "float32", "--kv-cache-memory-gib", "0.05", *extra]


@pytest.fixture(scope="module", params=["process", "thread"])
def server(request, tiny):
    extra = ["--log-stats-interval", "0.2"]
    extra += [] if request.param == "process" else ["--no-engine-process"]
    for srv in server_fixture(server_args(tiny, *extra)):
        srv.mode = request.param
        yield srv


def chat_body(**kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "open the settings app"}],
            "temperature": 0, **kw}


def sse_events(lines) -> list[dict]:
    return [json.loads(line[6:]) for line in lines
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_where_the_core_runs(server):
    pid = server.core_pid()
    if server.mode == "process":
        assert pid is not None and pid != server.proc.pid
        assert pid in server.processes()
        with open(f"/proc/{pid}/stat") as f:     # a child of the server
            assert int(f.read().rsplit(")", 1)[1].split()[1]) == server.proc.pid
    else:
        assert pid is None and "engine core: a thread of the server process" in server.log()


def test_the_engine_logs_its_pace_while_it_works(server):
    r = httpx.post(server.url("/v1/chat/completions"),
                   json=chat_body(max_tokens=300, ignore_eos=True), timeout=120)
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    while not (lines := re.findall(r"engine: (\d+) steps .* generation (\d+) tok/s", server.log())):
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    assert any(int(steps) > 0 and int(rate) > 0 for steps, rate in lines), lines


def test_a_lagging_stream_equals_the_non_streamed_answer(server):
    """The client reads nothing for a while through a tiny receive window, so the server's
    writes back up and tokens may pile up behind the stream (whether they do depends on the
    kernel's socket buffers: test_async_llm.py makes a consumer lag for certain). Merged or
    not, the chunks add up to the non-streamed answer: text, token count, logprobs, finish."""
    body = chat_body(max_tokens=600, ignore_eos=True, logprobs=True, top_logprobs=2)
    start = time.monotonic()
    full = httpx.post(server.url("/v1/chat/completions"), json=body, timeout=120).json()
    generation_s = time.monotonic() - start
    choice = full["choices"][0]

    slow = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)])
    with httpx.Client(transport=slow, timeout=120) as client:
        with client.stream("POST", server.url("/v1/chat/completions"),
                           json={**body, "stream": True,
                                 "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200
            # the engine finishes meanwhile, far ahead of what the buffers hold (~200 chunks)
            time.sleep(max(3.0, 2 * generation_s))
            events = sse_events(r.iter_lines())
    deltas = [e["choices"][0] for e in events if e["choices"]]
    tokens_per_chunk = [len(d["logprobs"]["content"]) for d in deltas if d.get("logprobs")]
    print(f"{server.mode}: {len(tokens_per_chunk)} chunks, up to {max(tokens_per_chunk)} tokens")
    assert sum(tokens_per_chunk) == 600
    assert "".join(d["delta"].get("content") or "" for d in deltas) == \
        choice["message"]["content"]
    streamed_lps = [t for d in deltas if d.get("logprobs") for t in d["logprobs"]["content"]]
    assert [(t["token"], t["logprob"]) for t in streamed_lps] == \
        [(t["token"], t["logprob"]) for t in choice["logprobs"]["content"]]
    assert [len(t["top_logprobs"]) for t in streamed_lps] == [2] * 600
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == ["length"]
    assert events[-1]["usage"]["completion_tokens"] == full["usage"]["completion_tokens"] == 600


def test_metrics_come_from_the_core(server):
    httpx.post(server.url("/v1/chat/completions"), json=chat_body(max_tokens=5), timeout=60)
    text = httpx.get(server.url("/metrics")).text
    assert "vllm:generation_tokens_total" in text and 'max_model_len="1024"' in text
    assert server.metrics()  # parses
    m = {k.split("{")[0]: v for k, v in server.metrics().items()}
    assert m["vllm:generation_tokens_total"] >= 5 and m["vllm:num_requests_running"] == 0


# ---- the core's process: death, start-up failure, shutdown ----------------------------------
def test_a_killed_core_ends_the_streams_and_the_server_exits_1(tiny):
    """A core that died cannot serve again: the stream gets an error event, and the server
    exits non-zero (a supervisor restarts it) instead of answering 503 for ever."""
    server = ServerProcess(server_args(tiny)).start()
    try:
        pid = server.core_pid()
        body = chat_body(max_tokens=900, ignore_eos=True, stream=True)
        with httpx.stream("POST", server.url("/v1/chat/completions"), json=body,
                          timeout=60) as r:
            lines = r.iter_lines()
            for _ in range(3):    # the stream is under way
                next(line for line in lines if line.startswith("data: "))
            os.kill(pid, signal.SIGKILL)
            rest = [line for line in lines if line]
        errors = [json.loads(line[6:])["error"] for line in rest
                  if line.startswith("data: {\"error\"")]
        assert len(errors) == 1 and "killed by SIGKILL" in errors[0]["message"], rest[-3:]
        assert rest[-1] == "data: [DONE]"
        assert server.proc.wait(30) == 1
        log = server.log()
        assert "the engine core stopped" in log and "exits with status 1" in log
        assert "Traceback" not in log
    finally:
        server.stop()
    assert not wait_gone(server)


def test_sigterm_stops_the_core_process_too(tiny):
    server = ServerProcess(server_args(tiny)).start()
    try:
        core = server.core_pid()
        assert core in server.processes()
        r = httpx.post(server.url("/v1/chat/completions"), json=chat_body(max_tokens=4))
        assert r.status_code == 200
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.log()
    assert not wait_gone(server), "the server left processes behind"
    assert "Traceback" not in server.log()


def test_sigterm_ends_streams_left_at_the_shutdown_timeout_with_an_error(tiny):
    """A stream still running when --shutdown-timeout runs out ends with an error event and
    [DONE], not a cut-off body; no traceback, exit 0."""
    server = ServerProcess(server_args(tiny, "--shutdown-timeout", "0.3")).start()
    try:
        body = chat_body(max_tokens=MAX_LEN - 64, ignore_eos=True, stream=True)
        with httpx.stream("POST", server.url("/v1/chat/completions"), json=body,
                          timeout=60) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(line for line in lines if line.startswith("data: "))
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2][6:])["error"]
        assert "shutting down" in error["message"] and error["type"] == "server_error"
        assert not any('"finish_reason": "length"' in line for line in rest)
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.log()
    assert "Traceback" not in server.log() and "CancelledError" not in server.log()
    assert not wait_gone(server)


def test_a_core_that_cannot_start_fails_the_server_start_with_its_reason(tiny):
    """A KV cache too small for max_model_len is found only by the core, in its process."""
    marker = f"cannot-start-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "AUTOGLM_TEST_SERVER": marker}
    args = server_args(tiny)
    args[args.index("0.05")] = "0.00001"
    r = subprocess.run([sys.executable, "-m", "autoglm_serve.cli", "serve", *args,
                        "--host", "127.0.0.1", "--port", str(free_port())], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "error: cannot start the engine: the KV cache holds" in r.stderr
    assert "fewer than max_model_len=1024" in r.stderr
    assert not processes_with_marker(marker)

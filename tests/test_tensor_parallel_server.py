"""The deployment guides' two-GPU command line, module name and all, served on CPUs over gloo
with a tiny GLM-4.1V: it answers the real openai client; then one of its tensor-parallel
workers is killed mid-stream, and the request fails with an error naming the worker and the
server exits non-zero within seconds. A worker that dies while the server is idle ends it too,
its last words naming the worker."""
import os
import re
import signal
import time

import pytest
from openai import APIError, OpenAI

from tests.glm4v_fixtures import make_tiny_glm4v
from tests.server_fixtures import ServerProcess, wait_gone

# as the guides give it, with a smaller KV cache for the shared CPU machine
GUIDES_LINE = ["--tensor-parallel-size", "2", "--max-model-len", "4096",
               "--enable-chunked-prefill", "--max-num-seqs", "32",
               "--gpu-memory-utilization", "0.9"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_glm4v(tmp_path_factory.mktemp("tiny-glm4v-tp"))


def worker_pid(server: ServerProcess) -> int:
    m = re.search(r"tensor parallelism over 2 ranks: .*rank 1 pid (\d+)", server.log(10**6))
    assert m, server.log()
    return int(m.group(1))


def test_guides_line_serves_then_a_dead_worker_ends_the_server(model):
    server = ServerProcess(["--model", str(model), *GUIDES_LINE, "--kv-cache-memory-gib", "0.05"],
                           module="autoglm_serve.entrypoints.openai.api_server", subcommand=None)
    server.start()
    try:
        client = OpenAI(base_url=server.url("/v1"), api_key="EMPTY", max_retries=0)
        reply = client.chat.completions.create(
            model=str(model), messages=[{"role": "user", "content": "hello"}],
            max_tokens=8, temperature=0)
        assert reply.choices[0].message.content and reply.usage.completion_tokens == 8

        stream = client.chat.completions.create(
            model=str(model), messages=[{"role": "user", "content": "count"}],
            max_tokens=3000, temperature=0, stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(chunks)                                   # the request is running
        os.kill(worker_pid(server), signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(APIError) as failed:
            for _ in chunks:
                pass
        assert "tensor-parallel worker rank 1" in str(failed.value), str(failed.value)
        server.proc.wait(timeout=30)
        assert time.monotonic() - killed < 20
        assert server.proc.returncode not in (0, None)
        assert "was killed by SIGKILL" in server.log(10**6)
    finally:
        stop_leaving_nothing(server)


def stop_leaving_nothing(server):
    """Stops the server; none of its processes (workers included) may outlive it."""
    server.stop(timeout=10)
    left = wait_gone(server)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind by the server: {left}"


def test_a_worker_dead_while_idle_ends_the_server_naming_it(model):
    server = ServerProcess(["--model", str(model), "--tensor-parallel-size", "2",
                            "--kv-cache-memory-gib", "0.05"])
    server.start()
    try:
        os.kill(worker_pid(server), signal.SIGKILL)
        server.proc.wait(timeout=30)
        assert server.proc.returncode == 1
        assert ("the engine core stopped: tensor-parallel worker rank 1 (pid "
                in server.log(10**6))
    finally:
        stop_leaving_nothing(server)

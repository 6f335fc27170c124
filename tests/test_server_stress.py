"""200 concurrent streams, some cancelled by their clients halfway: the rest complete, and the
engine ends with nothing running and every KV block free (aborts free their blocks)."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.server_fixtures import metric, server_fixture

N_STREAMS = 200
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server():
    yield from server_fixture(["--max-model-len", "1024", "--max-num-seqs", "256"])


async def _stream(c: httpx.AsyncClient, i: int, cancel_after: int | None) -> dict:
    body = {"messages": [{"role": "user", "content": f"Tell me fact number {i} about cats."}],
            "max_tokens": MAX_TOKENS, "temperature": 0.7, "seed": i, "ignore_eos": True,
            "stream": True}
    chunks, finish, text = 0, None, ""
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += choice["delta"].get("content") or ""
            finish = choice["finish_reason"] or finish
            chunks += 1
            if cancel_after is not None and chunks >= cancel_after:
                return {"cancelled": True, "chunks": chunks}   # leaving the block closes it
    return {"cancelled": False, "finish": finish, "text": text, "chunks": chunks}


def test_200_streams_with_cancellations_leave_no_running_requests_and_free_kv(server):
    async def run():
        limits = httpx.Limits(max_connections=N_STREAMS + 10)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=600,
                                     limits=limits) as c:
            # Every 4th client walks away after a few chunks (halfway through its answer).
            return await asyncio.gather(*[
                _stream(c, i, MAX_TOKENS // 2 if i % 4 == 0 else None)
                for i in range(N_STREAMS)])

    t0 = time.monotonic()
    results = asyncio.run(run())
    elapsed = time.monotonic() - t0
    done = [r for r in results if not r["cancelled"]]
    assert len(done) == N_STREAMS - N_STREAMS // 4
    # ignore_eos: every kept stream runs to its token limit; role + content chunks + final.
    assert all(r["finish"] == "length" and r["text"] for r in done)
    assert all(r["chunks"] >= MAX_TOKENS // 2 for r in results)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = server.metrics()
        if metric(m, "vllm:num_requests_running") == 0 and \
                metric(m, "vllm:kv_cache_usage_perc") == 0:
            break
        time.sleep(0.5)
    assert metric(m, "vllm:num_requests_running") == 0
    assert metric(m, "vllm:num_requests_waiting") == 0
    assert metric(m, "vllm:kv_cache_usage_perc") == 0
    success = {k: v for k, v in m.items() if k.startswith("vllm:request_success_total")}
    assert sum(v for k, v in success.items() if 'finished_reason="length"' in k) >= len(done)
    assert sum(v for k, v in success.items() if 'finished_reason="abort"' in k) >= N_STREAMS // 4
    print(f"{N_STREAMS} streams ({N_STREAMS // 4} cancelled) in {elapsed:.1f} s")
    assert server.healthy()


def test_non_streaming_client_timeout_aborts_its_request(server):
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 900,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url("/v1/chat/completions"), json=body, timeout=3)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = server.metrics()
        if metric(m, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.2)
    assert metric(m, "vllm:num_requests_running") == 0
    assert metric(m, "vllm:kv_cache_usage_perc") == 0

"""One request's failure fails that request alone: the engine keeps serving the others, with
the same tokens, and gives back every KV block (engine/core/fault_isolation.py). Faults are injected
by token id (engine/core/fault_injection.py), so a test chooses which request is the hostile one."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.engine.core import fault_isolation
from tests.server_fixtures import metric, server_fixture
from tests.tiny_models import build_tiny_decoder

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
OOM_TOKEN, ERROR_TOKEN = 98, 99
GOOD = [[5, 17, 33, 2, 9, 41, 7], list(range(10, 50)), [3] * 5 + [60, 61, 62]]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path, _ = build_tiny_decoder(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    return path


def make_llm(path, monkeypatch, faults: str | None, **kwargs) -> LLM:
    if faults:
        monkeypatch.setenv("AUTOGLM_INJECT_FAULT", faults)
    else:
        monkeypatch.delenv("AUTOGLM_INJECT_FAULT", raising=False)
    settings = dict(skip_tokenizer_init=True, block_size=8, dtype="float32", max_model_len=64,
                    max_num_batched_tokens=64, num_kv_blocks=48)
    return LLM(str(path), **{**settings, **kwargs})


def tokens(outputs) -> list[list[int]]:
    return [[c.token_ids for c in out.outputs] for out in outputs]


def assert_idle(llm: LLM) -> None:
    core = llm.engine.core
    assert not core.has_unfinished() and not core.isolation.isolating
    assert core.kv.num_free_blocks == core.kv.num_blocks


@pytest.fixture(scope="module")
def reference(tiny_path):
    llm = LLM(str(tiny_path), skip_tokenizer_init=True, block_size=8, dtype="float32",
              max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=48)
    return tokens(llm.generate(GOOD, GREEDY))


@pytest.mark.parametrize("bad_token, oom", [(ERROR_TOKEN, False), (OOM_TOKEN, True)])
def test_a_failing_request_fails_alone(tiny_path, reference, monkeypatch, bad_token, oom):
    """Batched with three good requests, the bad one fails with its error; the good ones get
    the tokens they get on an engine without faults, and no block stays taken."""
    llm = make_llm(tiny_path, monkeypatch, f"oom:{OOM_TOKEN},error:{ERROR_TOKEN}")
    bad = [4, 8, bad_token, 15]
    outs = llm.generate(GOOD[:2] + [bad] + GOOD[2:], GREEDY)
    failed = outs[2]
    assert failed.finished and failed.error is not None
    assert [c.finish_reason for c in failed.outputs] == ["error"]
    assert failed.error.out_of_memory is oom
    assert ("memory" if oom else "injected: an error") in failed.error.message
    assert tokens(outs[:2] + outs[3:]) == reference
    assert_idle(llm)
    assert tokens(llm.generate(GOOD, GREEDY)) == reference      # and it serves on


def test_every_child_of_a_failed_request_ends(tiny_path, monkeypatch):
    llm = make_llm(tiny_path, monkeypatch, f"error:{ERROR_TOKEN}")
    sampled = SamplingParams(temperature=1.0, n=3, max_tokens=6, seed=7)
    bad, good = llm.generate([[1, ERROR_TOKEN, 2], GOOD[0]], sampled)
    assert [c.finish_reason for c in bad.outputs] == ["error"] * 3
    assert [len(c.token_ids) for c in good.outputs] == [6, 6, 6]
    assert_idle(llm)


def test_out_of_memory_is_retried_with_smaller_chunks(tiny_path, reference, monkeypatch):
    """Steps of more than 20 tokens run out of memory: the 40-token prompt is run alone in
    halved chunks until it is in, then batched again; every token equals the reference."""
    llm = make_llm(tiny_path, monkeypatch, "oom-above:20")
    outs = llm.generate(GOOD, GREEDY)
    assert all(o.error is None for o in outs)
    assert tokens(outs) == reference
    assert_idle(llm)


def test_an_unrecoverable_error_stops_the_engine(tiny_path, monkeypatch):
    """A CUDA error (an illegal address, a device-side assert) leaves the device unusable:
    the engine stops on it rather than failing request after request."""
    llm = make_llm(tiny_path, monkeypatch, None)
    runner = llm.engine.core.runner

    def broken(_scheduled):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(runner, "launch", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        llm.generate(GOOD[:1], GREEDY)


def test_a_run_of_failures_stops_the_engine(tiny_path, monkeypatch):
    """Every step failing, whoever runs in it, is the engine's fault, not a request's."""
    llm = make_llm(tiny_path, monkeypatch, None)
    monkeypatch.setattr(fault_isolation, "MAX_CONSECUTIVE_FAILURES", 3)

    def broken(_scheduled):
        raise ValueError("a bug")

    monkeypatch.setattr(llm.engine.core.runner, "launch", broken)
    with pytest.raises(RuntimeError, match="steps in a row failed"):
        llm.generate(GOOD * 2, GREEDY)


# ---- through the server -------------------------------------------------------------------
SERVER_OOM, SERVER_ERROR = 48000, 48001     # token ids of SmolLM2's vocabulary (49152)


@pytest.fixture(scope="module")
def server():
    yield from server_fixture(["--max-model-len", "512", "--kv-cache-memory-gib", "0.25"],
                              env={"AUTOGLM_INJECT_FAULT": f"oom:{SERVER_OOM},"
                                                           f"error:{SERVER_ERROR}"})


def test_the_server_fails_the_request_and_serves_the_others(server):
    body = {"max_tokens": 24, "ignore_eos": True, "temperature": 0}

    async def run():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as c:
            good = [c.post("/v1/completions", json={**body, "prompt": p})
                    for p in ("The capital of France is", "Once upon a time")]
            oom = c.post("/v1/completions", json={**body, "prompt": [1, 2, SERVER_OOM]})
            err = c.post("/v1/completions", json={**body, "prompt": [1, SERVER_ERROR],
                                                  "stream": True})
            return await asyncio.gather(*good, oom, err)

    first, second, oom, err = asyncio.run(run())
    for r in (first, second):
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 24
    assert oom.status_code == 503, oom.text
    assert oom.headers["retry-after"] == "1"
    assert oom.json()["error"]["code"] == "out_of_memory"
    assert err.status_code == 500, err.text         # before its stream began: a status
    assert err.json()["error"]["code"] == "request_failed"
    assert "injected" in err.json()["error"]["message"]
    assert server.healthy()
    m = server.metrics()
    assert metric(m, "vllm:num_requests_running") == 0
    assert metric(m, "vllm:kv_cache_usage_perc") == 0
    again = httpx.post(server.url("/v1/completions"),
                       json={**body, "prompt": "The capital of France is"}, timeout=120)
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]

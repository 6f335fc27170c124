"""Schemathesis against the server's own /openapi.json: every route, schema-valid and
schema-breaking bodies. No request may get a 5xx, a schema-breaking body must be refused, every
status and JSON body must be the documented one (4xx: an OpenAI-shaped error, exactly its four
keys), and afterwards nothing is left running or holding KV cache.

The point is validation, not generation: the server's default max_tokens is 4 and a larger
explicit one that fits the context is cut to 4 before sending, so each case costs at most
n x 4 tokens. Derandomized and without an example database, so CI sees the same cases.
"""
from __future__ import annotations

import os
import time
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (negative_data_rejection,
                                               response_schema_conformance,
                                               status_code_conformance)

from tests.server_fixtures import metric, server_fixture

MAX_LEN = 256
# Per operation, in the fuzzing phase (the coverage phase adds its own edge cases); raise it
# for a deeper, slower run: FUZZ_MAX_EXAMPLES=300 pytest tests/test_fuzz_openapi.py
MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "25"))
MAX_TOKENS = 4
ERROR_KEYS = {"message", "type", "param", "code"}
SEEN: Counter = Counter()   # (operation, status) over the fuzz, checked and printed after it


@pytest.fixture(scope="module")
def server():
    yield from server_fixture(["--max-model-len", str(MAX_LEN), "--kv-cache-memory-gib", "0.25",
                               "--max-num-seqs", "4", "--max-n", "4",
                               "--override-generation-config",
                               f'{{"max_new_tokens": {MAX_TOKENS}}}'])


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.url("/openapi.json"))


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request):
    """schemathesis 4.32's lazy schema reads `node._nodeid`, which pytest 9.2 no longer has."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


def openai_error_shape(ctx, response, case):
    """A 4xx is {"error": {"message", "type", "param", "code"}}, never FastAPI's 422 shape."""
    if response.status_code < 400:
        return None
    assert response.status_code != 422, f"FastAPI's own 422 leaked: {response.text[:300]}"
    err = response.json().get("error")
    assert isinstance(err, dict) and set(err) == ERROR_KEYS, response.text[:300]
    assert isinstance(err["message"], str) and err["message"], response.text[:300]
    assert "Traceback" not in response.text
    return None


def _bounded(case) -> None:
    """Caps what a schema-valid request may generate; a max_tokens past the context is kept
    (it is a cheap 400, and worth asking)."""
    if not isinstance(case.body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        value = case.body.get(key)
        if type(value) is int and MAX_TOKENS < value < MAX_LEN:
            case.body[key] = MAX_TOKENS


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_openapi_fuzz(case, server):
    _bounded(case)
    response = case.call_and_validate(timeout=120, checks=[
        not_a_server_error, negative_data_rejection, status_code_conformance,
        response_schema_conformance, openai_error_shape])
    SEEN[(case.operation.label, response.status_code)] += 1


def test_server_is_clean_after_the_fuzz(server):
    """Runs after the fuzz (file order): nothing left running, KV back to 0, still serving."""
    print(f"fuzz: {sum(SEEN.values())} requests:", dict(sorted(SEEN.items())))
    for route in ("POST /v1/chat/completions", "POST /v1/completions", "POST /tokenize"):
        # Both sides reached: some bodies were served, some refused.
        assert SEEN[(route, 200)] and SEEN[(route, 400)], (route, SEEN)
    assert server.healthy()
    deadline = time.monotonic() + 10
    while True:
        m = server.metrics()
        running = metric(m, "vllm:num_requests_running")
        kv = metric(m, "vllm:kv_cache_usage_perc")
        if (running, kv) == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert running == 0 and kv == 0, (running, kv)
    r = httpx.post(server.url("/v1/chat/completions"), timeout=120,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None
    assert "Traceback" not in server.log(10**6)

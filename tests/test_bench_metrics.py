"""Metrics of autoglm_serve.bench against hand-built timestamp streams (no server)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoglm_serve.bench.metrics import (
    Distribution, fill_output_tokens, max_concurrency_seen, meets_slo, parse_slo, summarize,
)
from autoglm_serve.bench.record import RequestRecord


def stream(index: int, start: float, chunks: list[float], end: float, tokens: int | None,
           prompt_len: int = 10, text: str = "") -> RequestRecord:
    return RequestRecord(index=index, prompt_len=prompt_len, expected_output_len=16, start=start,
                         end=end, chunk_times=chunks, output_tokens=tokens, success=True,
                         generated_text=text or " ".join(["w"] * len(chunks)))


def failed(index: int, start: float, end: float, error: str) -> RequestRecord:
    return RequestRecord(index=index, prompt_len=10, expected_output_len=16, start=start, end=end,
                         success=False, error=error)


def test_per_request_ttft_itl_tpot_e2el():
    # Sent at 1.0; chunks at 1.2, 1.3, 1.45, 1.5; stream complete at 1.6; 4 tokens.
    r = stream(0, 1.0, [1.2, 1.3, 1.45, 1.5], 1.6, tokens=4)
    assert r.ttft == pytest.approx(0.2)
    assert r.itl == pytest.approx([0.1, 0.15, 0.05])
    assert r.e2el == pytest.approx(0.6)
    # TPOT excludes the first token: (0.6 - 0.2) / (4 - 1).
    assert r.tpot == pytest.approx(0.4 / 3)


def test_tpot_uses_token_count_not_chunk_count():
    # Two chunks carrying 9 tokens between them (a server that batches tokens per chunk).
    r = stream(0, 0.0, [0.5, 1.0], 1.4, tokens=9)
    assert r.itl == pytest.approx([0.5])
    assert r.tpot == pytest.approx((1.4 - 0.5) / 8)


def test_single_token_has_no_tpot_and_no_itl():
    r = stream(0, 0.0, [0.3], 0.35, tokens=1)
    assert r.ttft == pytest.approx(0.3)
    assert r.tpot is None
    assert r.itl == []


def test_failed_request_has_no_latencies():
    r = failed(0, 0.0, 5.0, "timeout: no complete response after 5 s")
    assert r.ttft is None and r.e2el is None and r.tpot is None and r.itl == []


def test_distribution_matches_numpy_percentiles():
    values = [0.1, 0.2, 0.3, 0.4, 1.0]
    d = Distribution.of_seconds(values)
    ms = np.array(values) * 1000
    assert d.count == 5
    assert d.mean == pytest.approx(ms.mean())
    assert d.median == pytest.approx(300.0)
    assert d.p90 == pytest.approx(np.percentile(ms, 90))  # 760: linear interpolation
    assert d.p90 == pytest.approx(760.0)
    assert d.p99 == pytest.approx(976.0)
    assert d.std == pytest.approx(ms.std())
    assert d.max == pytest.approx(1000.0)


def test_distribution_of_nothing_is_empty_not_zero():
    d = Distribution.of_seconds([])
    assert d.count == 0 and d.mean is None and d.p99 is None


def test_summary_throughputs_and_distributions():
    records = [
        stream(0, 0.0, [0.1, 0.2, 0.3], 0.3, tokens=3, prompt_len=100),  # ttft .1 tpot .1
        stream(1, 0.0, [0.3, 0.5, 0.7, 0.9, 1.1], 1.1, tokens=5, prompt_len=50),  # ttft .3 tpot .2
        stream(2, 1.0, [1.2, 1.3], 1.3, tokens=2, prompt_len=30),  # ttft .2 tpot .1
    ]
    s = summarize(records, duration_s=2.0)
    assert (s.completed, s.failed) == (3, 0)
    assert s.total_input_tokens == 180 and s.total_output_tokens == 10
    assert s.request_throughput == pytest.approx(1.5)
    assert s.output_throughput == pytest.approx(5.0)
    assert s.total_token_throughput == pytest.approx(95.0)
    assert s.ttft_ms.mean == pytest.approx(200.0)
    assert s.ttft_ms.median == pytest.approx(200.0)
    assert s.tpot_ms.mean == pytest.approx((100 + 200 + 100) / 3)
    # ITLs pooled over all requests: 2 + 4 + 1 gaps.
    assert s.itl_ms.count == 7
    assert s.itl_ms.mean == pytest.approx((0.1 * 2 + 0.2 * 4 + 0.1) / 7 * 1000)
    assert s.e2el_ms.mean == pytest.approx((0.3 + 1.1 + 0.3) / 3 * 1000)
    assert s.goodput is None  # no SLO given
    assert s.max_concurrent_requests == 2
    assert s.failure_reasons == {}


def test_failed_and_empty_responses_count_as_failures_with_reasons():
    records = [
        stream(0, 0.0, [0.1, 0.2], 0.2, tokens=2, prompt_len=10),
        failed(1, 0.0, 0.5, "RemoteProtocolError: peer closed connection"),
        failed(2, 0.1, 0.6, "RemoteProtocolError: peer closed connection"),
        failed(3, 0.2, 0.2, "no generated text in the response"),  # empty stream
        failed(4, 0.3, 0.3, "HTTP 422: {\"detail\":\"bad field\"}\nmore"),
    ]
    s = summarize(records, duration_s=1.0)
    assert (s.completed, s.failed) == (1, 4)
    # Failures add no tokens and no latencies.
    assert s.total_input_tokens == 10 and s.total_output_tokens == 2
    assert s.ttft_ms.count == 1 and s.e2el_ms.count == 1
    assert s.request_throughput == pytest.approx(1.0)
    assert s.failure_reasons == {
        "RemoteProtocolError: peer closed connection": 2,
        "no generated text in the response": 1,
        "HTTP 422: {\"detail\":\"bad field\"}": 1,
    }


def test_all_failed_gives_zero_throughput_and_empty_distributions():
    s = summarize([failed(0, 0.0, 1.0, "ConnectError: refused")], duration_s=1.0)
    assert s.completed == 0 and s.request_throughput == 0.0 and s.output_throughput == 0.0
    assert s.ttft_ms.mean is None and s.tpot_ms.mean is None and s.itl_ms.count == 0
    assert s.goodput is None


def test_goodput_counts_requests_meeting_every_slo():
    records = [
        stream(0, 0.0, [0.1, 0.15, 0.2], 0.2, tokens=3),  # ttft 100, tpot 50, e2el 200: good
        stream(1, 0.0, [0.6, 0.65, 0.7], 0.7, tokens=3),  # ttft 600: misses the TTFT SLO
        stream(2, 0.0, [0.1, 0.4, 0.7], 0.7, tokens=3),  # tpot 300: misses the TPOT SLO
        stream(3, 0.0, [0.2], 0.2, tokens=1),  # one token: TPOT counts as 0 -> good
        failed(4, 0.0, 0.1, "HTTP 500: boom"),  # failed: never good
    ]
    slo = {"ttft": 500.0, "tpot": 100.0}
    assert [meets_slo(r, slo) for r in records] == [True, False, False, True, False]
    s = summarize(records, duration_s=2.0, slo=slo)
    assert s.goodput == pytest.approx(2 / 2.0)
    # With an E2E limit as well, request 0 (200 ms) passes and request 3 (200 ms) too.
    s = summarize(records, duration_s=2.0, slo={"e2el": 250.0})
    assert s.goodput == pytest.approx(2 / 2.0)
    # A limit exactly at the value passes (<=), as in vLLM.
    assert meets_slo(records[0], {"ttft": 100.0})


def test_parse_slo():
    assert parse_slo(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slo(["ttft:500,e2el:2000"]) == {"ttft": 500.0, "e2el": 2000.0}
    with pytest.raises(ValueError):
        parse_slo(["latency:5"])
    with pytest.raises(ValueError):
        parse_slo(["ttft:-1"])


def test_output_tokens_counted_when_server_sends_no_usage():
    with_usage = stream(0, 0.0, [0.1, 0.2], 0.2, tokens=7)
    no_usage = stream(1, 0.0, [0.1, 0.2, 0.3], 0.3, tokens=None, text="tap the button now")
    fill_output_tokens([with_usage, no_usage], lambda text: len(text.split()))
    assert (with_usage.output_tokens, with_usage.output_tokens_source) == (7, "usage")
    assert (no_usage.output_tokens, no_usage.output_tokens_source) == (4, "tokenizer")
    # Without a tokenizer: one token per text chunk.
    chunks_only = stream(2, 0.0, [0.1, 0.2, 0.3], 0.3, tokens=None)
    fill_output_tokens([chunks_only], None)
    assert (chunks_only.output_tokens, chunks_only.output_tokens_source) == (3, "chunks")


def test_max_concurrency_seen():
    a = stream(0, 0.0, [0.5], 1.0, tokens=1)
    b = stream(1, 1.0, [1.5], 2.0, tokens=1)  # starts when a ends: no overlap
    c = stream(2, 0.5, [1.2], 1.5, tokens=1)
    assert max_concurrency_seen([a, b]) == 1
    assert max_concurrency_seen([a, b, c]) == 2


def test_summary_zero_duration_does_not_divide_by_zero():
    s = summarize([], duration_s=0.0)
    assert s.completed == 0 and math.isfinite(s.request_throughput)

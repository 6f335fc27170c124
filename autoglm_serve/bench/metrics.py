"""Serving metrics, defined as vLLM's serving benchmark defines them so figures are comparable.

Per request (see RequestRecord): TTFT, TPOT = (E2EL - TTFT) / (output_tokens - 1), ITL = every gap
between streamed chunks, E2EL. Per run: distributions (mean, median, std, p90, p99, in ms) over
successful requests; ITLs pooled over all requests; throughputs over the wall-clock duration of
the run; goodput = requests per second that met every given SLO. Failed requests count in
`failed` and in `failure_reasons`, never in latencies or token totals.

One deliberate difference: vLLM starts TTFT at the first chunk that has `choices`, which for some
servers is an empty role-only chunk sent before prefill. We start it at the first chunk that
carries generated text, which is what a user waits for and equals vLLM's figure on vLLM itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from autoglm_serve.bench.record import RequestRecord

SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class Distribution:
    """Summary of a latency sample in milliseconds; all None when the sample is empty."""

    count: int = 0
    mean: float | None = None
    median: float | None = None
    std: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of_seconds(cls, values: Iterable[float]) -> "Distribution":
        ms = np.asarray(list(values), dtype=np.float64) * 1000.0
        if ms.size == 0:
            return cls()
        # numpy's default linear interpolation, as vLLM uses.
        return cls(
            count=int(ms.size),
            mean=float(ms.mean()),
            median=float(np.median(ms)),
            std=float(ms.std()),
            p90=float(np.percentile(ms, 90)),
            p99=float(np.percentile(ms, 99)),
            max=float(ms.max()),
        )


@dataclass
class Summary:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # generated tokens / s
    total_token_throughput: float  # (prompt + generated tokens) / s
    goodput: float | None  # requests / s meeting every SLO; None when no SLO was given
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2el_ms: Distribution
    max_concurrent_requests: int
    failure_reasons: dict[str, int] = field(default_factory=dict)
    output_tokens_source: dict[str, int] = field(default_factory=dict)


def parse_slo(items: Iterable[str]) -> dict[str, float]:
    """Parse ["ttft:500", "tpot:50"] or ["ttft:500,tpot:50"] into {"ttft": 500.0, ...} (ms)."""
    slo: dict[str, float] = {}
    for item in items:
        for part in filter(None, (p.strip() for p in item.split(","))):
            name, sep, value = part.partition(":")
            name = name.strip().lower()
            if not sep or name not in SLO_METRICS:
                raise ValueError(f"bad SLO {part!r}: expected NAME:MS with NAME in {SLO_METRICS}")
            ms = float(value)
            if ms <= 0:
                raise ValueError(f"bad SLO {part!r}: the limit must be positive milliseconds")
            slo[name] = ms
    return slo


def meets_slo(record: RequestRecord, slo: dict[str, float]) -> bool:
    """True when a successful request is within every limit (ms). A request with fewer than two
    output tokens has no decode phase; its TPOT counts as 0, as in vLLM."""
    if not record.success:
        return False
    values = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.e2el}
    return all(values[name] is not None and values[name] * 1000.0 <= ms for name, ms in slo.items())


def fill_output_tokens(
    records: Iterable[RequestRecord], count_tokens: Callable[[str], int] | None
) -> None:
    """Give every successful request an output-token count when the server sent no usage:
    the tokenizer's count of its text, or failing that the number of text chunks."""
    for r in records:
        if not r.success or r.output_tokens is not None:
            continue
        if count_tokens is not None:
            r.output_tokens = count_tokens(r.generated_text)
            r.output_tokens_source = "tokenizer"
        else:
            r.output_tokens = len(r.chunk_times)
            r.output_tokens_source = "chunks"


def max_concurrency_seen(records: Iterable[RequestRecord]) -> int:
    """Largest number of requests in flight at once (failed ones included: they held a slot)."""
    events: list[tuple[float, int]] = []
    for r in records:
        if r.end >= r.start:
            events += [(r.start, 1), (r.end, -1)]
    # At equal times, a finish is counted before a start: back-to-back requests do not overlap.
    events.sort(key=lambda e: (e[0], e[1]))
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def short_reason(error: str) -> str:
    """Group failures by the first line of their message, cut short, for the report."""
    first = (error or "unknown error").strip().splitlines()[0] if error.strip() else "unknown error"
    return first[:160]


def summarize(
    records: list[RequestRecord], duration_s: float, slo: dict[str, float] | None = None
) -> Summary:
    """Aggregate per-request records of one run (one sweep point) lasting `duration_s` seconds.

    Output-token counts must be filled in first (fill_output_tokens) where the server gave none.
    """
    ok = [r for r in records if r.success]
    failed = [r for r in records if not r.success]
    duration_s = max(duration_s, 1e-9)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    goodput = None
    if slo:
        goodput = sum(meets_slo(r, slo) for r in ok) / duration_s
    return Summary(
        completed=len(ok),
        failed=len(failed),
        duration_s=duration_s,
        total_input_tokens=in_tokens,
        total_output_tokens=out_tokens,
        request_throughput=len(ok) / duration_s,
        output_throughput=out_tokens / duration_s,
        total_token_throughput=(in_tokens + out_tokens) / duration_s,
        goodput=goodput,
        ttft_ms=Distribution.of_seconds(r.ttft for r in ok if r.ttft is not None),
        tpot_ms=Distribution.of_seconds(r.tpot for r in ok if r.tpot is not None),
        itl_ms=Distribution.of_seconds(gap for r in ok for gap in r.itl),
        e2el_ms=Distribution.of_seconds(r.e2el for r in ok if r.e2el is not None),
        max_concurrent_requests=max_concurrency_seen(records),
        failure_reasons=dict(Counter(short_reason(r.error) for r in failed).most_common()),
        output_tokens_source=dict(Counter(r.output_tokens_source for r in ok)),
    )

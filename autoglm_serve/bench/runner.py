"""The load generator of `bench serve`: arrivals, concurrency limits, the sweep, the GPU monitor.

Arrivals follow vLLM's benchmark: with a finite --request-rate the gaps between requests are
gamma-distributed with shape = burstiness and mean = 1/rate (burstiness 1 = Poisson); with an
infinite rate all requests are released at once. --max-concurrency caps requests in flight; a
request's clock starts when it is actually sent, after it got a slot.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator

import numpy as np
from tqdm import tqdm

from autoglm_serve.bench import phone_agent
from autoglm_serve.bench.client import ClientConfig, make_http_client, send_request
from autoglm_serve.bench.datasets import BenchRequest, load_dataset, load_tokenizer, token_counter
from autoglm_serve.bench.gpu_monitor import GpuMonitor
from autoglm_serve.bench.metrics import fill_output_tokens, summarize
from autoglm_serve.bench.record import RequestRecord


class BenchError(RuntimeError):
    """The benchmark could not run at all (bad arguments, server unreachable before the start)."""


@dataclass
class ServeBenchConfig:
    client: ClientConfig
    dataset: str = "random"
    num_prompts: int = 100
    input_len: int = 1024
    output_len: int | None = None  # dataset default when None (random: 128)
    range_ratio: float = 0.0
    request_rate: float = math.inf
    burstiness: float = 1.0
    concurrencies: list[int | None] = field(default_factory=lambda: [None])
    seed: int = 0
    tokenizer: str | None = None
    slo: dict[str, float] = field(default_factory=dict)
    agents: int | None = None  # phone-agent: defaults to the concurrency of the sweep point
    steps: int = 5
    step_delay_s: float = 0.0
    label: str = ""
    gpu_monitor: bool | None = None  # None: on when NVML finds a GPU
    gpu_interval_s: float = 0.1
    progress: bool = True
    warmup: bool = True


def _json_rate(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate


async def arrivals(
    items: list[Any], rate: float, burstiness: float, rng: np.random.Generator
) -> AsyncIterator[Any]:
    """Yield items at the times of a gamma (Poisson when burstiness = 1) arrival process."""
    for item in items:
        yield item
        if math.isinf(rate):
            continue
        await asyncio.sleep(float(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness))))


async def _run_requests(
    http, cfg: ServeBenchConfig, requests: list[BenchRequest], concurrency: int | None, bar: tqdm,
) -> list[RequestRecord]:
    limiter = asyncio.Semaphore(concurrency) if concurrency else None
    rng = np.random.default_rng(cfg.seed)

    async def one(i: int, req: BenchRequest) -> RequestRecord:
        if limiter is None:
            rec = await send_request(http, cfg.client, req, i)
        else:
            async with limiter:
                rec = await send_request(http, cfg.client, req, i)
        bar.update(1)
        return rec

    tasks = []
    async for i, req in arrivals(list(enumerate(requests)), cfg.request_rate, cfg.burstiness, rng):
        tasks.append(asyncio.create_task(one(i, req)))
    return list(await asyncio.gather(*tasks))


async def _run_agents(
    http, cfg: ServeBenchConfig, workload: phone_agent.PhoneAgentWorkload,
    concurrency: int | None, bar: tqdm,
) -> list[RequestRecord]:
    limiter = asyncio.Semaphore(concurrency) if concurrency else None
    rng = np.random.default_rng(cfg.seed)
    tasks = []
    async for agent in arrivals(list(range(workload.agents)), cfg.request_rate, cfg.burstiness, rng):
        tasks.append(asyncio.create_task(
            phone_agent.run_agent(http, cfg.client, workload, agent, limiter, lambda _r: bar.update(1))
        ))
    return [r for recs in await asyncio.gather(*tasks) for r in recs]


async def _check_server(http, cfg: ServeBenchConfig, first: BenchRequest | None) -> None:
    """One short request before measuring, so that a wrong URL or model fails fast and clearly."""
    probe = BenchRequest(prompt=first.prompt if first else "Hello", prompt_len=0, output_len=4,
                         messages=None)
    rec = await send_request(http, cfg.client, probe, -1)
    if not rec.success:
        raise BenchError(f"the server at {cfg.client.url} failed the first request: {rec.error}")


def _workload_for(cfg: ServeBenchConfig, concurrency: int | None,
                  shots: dict) -> phone_agent.PhoneAgentWorkload:
    agents = cfg.agents or concurrency or 1
    return phone_agent.PhoneAgentWorkload(
        agents=agents, steps=cfg.steps, output_len=cfg.output_len or 128, seed=cfg.seed,
        step_delay_s=cfg.step_delay_s, screenshots=shots,
    )


async def run_serve_bench(cfg: ServeBenchConfig) -> dict[str, Any]:
    """Run every sweep point against the server; return the JSON-ready result."""
    is_agent = cfg.dataset == "phone-agent"
    if is_agent and not cfg.client.is_chat:
        raise BenchError("the phone-agent dataset needs a chat endpoint")
    tokenizer = load_tokenizer(cfg.tokenizer)   # the model's name is not looked up on a hub
    requests: list[BenchRequest] = []
    shots: dict[tuple[int, int], str] = {}
    if not is_agent:
        try:
            requests = load_dataset(cfg.dataset, cfg.num_prompts, cfg.input_len, cfg.output_len,
                                    cfg.range_ratio, tokenizer, cfg.seed)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc
    else:
        # Render every screenshot any sweep point needs, before any clock starts.
        largest = _workload_for(cfg, max((c or 1) for c in cfg.concurrencies), shots)
        with tqdm(total=largest.num_requests, desc="rendering screenshots",
                  disable=not cfg.progress) as bar:
            largest.prepare(bar.update)

    monitor = GpuMonitor(cfg.gpu_interval_s) if cfg.gpu_monitor is not False else None
    if cfg.gpu_monitor and monitor is not None and not monitor.available:
        print(f"warning: --gpu-monitor asked for, but {monitor.note}")
    max_conn = max([c or 0 for c in cfg.concurrencies] + [cfg.num_prompts, cfg.agents or 0, 1])

    result: dict[str, Any] = {
        "kind": "serve",
        "label": cfg.label or cfg.client.model,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "base_url": cfg.client.base_url,
        "endpoint": cfg.client.endpoint,
        "model": cfg.client.model,
        "dataset": cfg.dataset,
        "config": _config_json(cfg),
        "gpu": {"available": bool(monitor and monitor.available),
                "note": monitor.note if monitor else "GPU monitor off (--no-gpu-monitor)",
                "devices": monitor.device_names if monitor else []},
        "points": [],
        "gpu_samples": [],
    }
    counter = token_counter(tokenizer) if tokenizer is not None else None
    async with make_http_client(cfg.client, max_conn) as http:
        if cfg.warmup:
            await _check_server(http, cfg, requests[0] if requests else None)
        t0 = time.perf_counter()
        # the wall clock at t0: places the points' and records' times (perf_counter seconds
        # from t0) beside a server's own wall-clock logs, such as its --step-trace
        result["t0_unix_s"] = time.time()
        if monitor:
            monitor.start()
        try:
            for concurrency in cfg.concurrencies:
                workload = _workload_for(cfg, concurrency, shots) if is_agent else None
                total = workload.num_requests if workload else len(requests)
                desc = f"max concurrency {concurrency or 'unlimited'}"
                with tqdm(total=total, desc=desc, disable=not cfg.progress) as bar:
                    start = time.perf_counter()
                    if workload:
                        records = await _run_agents(http, cfg, workload, concurrency, bar)
                    else:
                        records = await _run_requests(http, cfg, requests, concurrency, bar)
                    end = time.perf_counter()
                fill_output_tokens(records, counter)
                point = _point(cfg, concurrency, records, start, end, t0, monitor, workload)
                result["points"].append(point)
        finally:
            if monitor:
                monitor.stop()
    if monitor:
        result["gpu_samples"] = monitor.timeline(t0)
    return result


def _point(
    cfg: ServeBenchConfig, concurrency: int | None, records: list[RequestRecord], start: float,
    end: float, t0: float, monitor: GpuMonitor | None,
    workload: phone_agent.PhoneAgentWorkload | None,
) -> dict[str, Any]:
    summary = summarize(records, end - start, cfg.slo or None)
    point: dict[str, Any] = {
        "max_concurrency": concurrency,
        "request_rate": _json_rate(cfg.request_rate),
        "start_s": start - t0,
        "end_s": end - t0,
        "summary": asdict(summary),
        "gpu": asdict(monitor.stats(start, end)) if monitor and monitor.available else None,
        "records": [_record_json(r, t0) for r in records],
    }
    if workload is not None:
        point["phone_agent"] = {
            "agents": workload.agents,
            "steps": workload.steps,
            "steps_completed": summary.completed,
            "agent_steps_per_s": summary.completed / summary.duration_s,
            "episodes_completed": phone_agent.episodes_completed(records, workload.steps),
            "mean_latency_ms_by_step": phone_agent.latency_by_step(records),
        }
    return point


def _record_json(r: RequestRecord, t0: float) -> dict[str, Any]:
    """Raw record with times relative to the start of the run, plus the derived metrics."""
    d = asdict(r)
    d["start"], d["end"] = r.start - t0, r.end - t0
    d["chunk_times"] = [t - t0 for t in r.chunk_times]
    d["ttft_ms"] = None if r.ttft is None else r.ttft * 1000.0
    d["tpot_ms"] = None if r.tpot is None else r.tpot * 1000.0
    d["e2el_ms"] = None if r.e2el is None else r.e2el * 1000.0
    d["itl_ms"] = [x * 1000.0 for x in r.itl]
    return d


def _config_json(cfg: ServeBenchConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["request_rate"] = _json_rate(cfg.request_rate)
    if d["client"].get("api_key"):
        d["client"]["api_key"] = "***"
    return d

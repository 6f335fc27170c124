"""`bench offline`: our engine without HTTP, through the offline API, with the same metrics.

All prompts are submitted at once (request rate = inf) and the engine's own max_num_seqs limits
concurrency, so a sweep point rebuilds the engine with that limit. When the engine offers its
step API (add_request(delta=True) / step / has_unfinished) the driver steps it itself and
timestamps every step that produced tokens for a request, which gives TTFT, TPOT, ITL and E2E
latency exactly as a stream would. Otherwise it falls back to `LLM.generate` and the per-request
arrival / first-token / finish times it reports: TTFT, TPOT and E2E latency, no ITL.
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from autoglm_serve.bench.datasets import BenchRequest, load_dataset, load_tokenizer
from autoglm_serve.bench.gpu_monitor import GpuMonitor
from autoglm_serve.bench.metrics import summarize
from autoglm_serve.bench.record import RequestRecord
from autoglm_serve.bench.runner import BenchError, _record_json

log = logging.getLogger(__name__)


@dataclass
class OfflineBenchConfig:
    model: str | None
    dataset: str = "random"
    num_prompts: int = 100
    input_len: int = 1024
    output_len: int | None = None
    range_ratio: float = 0.0
    max_num_seqs: list[int | None] = field(default_factory=lambda: [None])
    temperature: float = 0.0
    ignore_eos: bool = False
    seed: int = 0
    tokenizer: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)  # passed to LLM(...) as is
    slo: dict[str, float] = field(default_factory=dict)
    label: str = ""
    gpu_monitor: bool | None = None
    gpu_interval_s: float = 0.1
    warmup: bool = True


def _import_engine():
    try:
        from autoglm_serve import LLM, SamplingParams  # type: ignore[attr-defined]
    except ImportError as exc:
        raise BenchError(f"the offline engine is not available: {exc}") from exc
    return LLM, SamplingParams


def _records_from_outputs(
    outputs: list[Any], requests: list[BenchRequest], clock_offset: float
) -> list[RequestRecord]:
    """RequestOutput (monotonic clock) -> RequestRecord (perf_counter clock, like the client)."""
    records = []
    for i, (out, req) in enumerate(zip(outputs, requests)):
        m = getattr(out, "metrics", None)
        comp = out.outputs[0] if getattr(out, "outputs", None) else None
        rec = RequestRecord(index=i, prompt_len=len(out.prompt_token_ids or []) or req.prompt_len,
                            expected_output_len=req.output_len)
        if m is None or comp is None or m.first_token_time is None or m.finished_time is None:
            rec.error = "engine returned no timing or no output"
            records.append(rec)
            continue
        rec.start = m.arrival_time + clock_offset
        rec.chunk_times = [m.first_token_time + clock_offset]
        rec.end = m.finished_time + clock_offset
        rec.output_tokens = len(comp.token_ids)
        rec.generated_text = comp.text or ""
        rec.success = rec.output_tokens > 0
        if not rec.success:
            rec.error = "no generated tokens"
        records.append(rec)
    return records


def _has_step_api(llm: Any) -> bool:
    engine = getattr(llm, "engine", None)
    return all(hasattr(engine, a) for a in ("add_request", "step", "has_unfinished"))


def _run_stepping(
    llm: Any, prompts: list[Any], params: list[Any], requests: list[BenchRequest]
) -> list[RequestRecord]:
    """Drive the engine step by step; one 'chunk' per step that gave a request new tokens."""
    engine = llm.engine
    records: dict[str, RequestRecord] = {}
    order: list[str] = []
    for i, (prompt, sp, req) in enumerate(zip(prompts, params, requests)):
        frontend = getattr(engine, "frontend", None)   # ours prepares prompts, vLLM's not
        rid = frontend.next_request_id() if frontend is not None else str(i)
        rec = RequestRecord(index=i, prompt_len=len(prompt) if isinstance(prompt, list)
                            else req.prompt_len, expected_output_len=req.output_len)
        rec.start = time.perf_counter()
        if frontend is not None:  # prompt -> PreparedPrompt (token ids, images)
            engine.add_request(rid, frontend.prepare(prompt), sp, delta=True)
        else:
            engine.add_request(rid, prompt, sp, delta=True)
        records[rid], order = rec, order + [rid]
    tokens = {rid: 0 for rid in order}
    texts: dict[str, list[str]] = {rid: [] for rid in order}
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            rec = records.get(out.request_id)
            if rec is None or not out.outputs:
                continue
            comp = out.outputs[0]
            if comp.token_ids:
                rec.chunk_times.append(now)
                tokens[out.request_id] += len(comp.token_ids)
                texts[out.request_id].append(comp.text or "")
            if out.prompt_token_ids:
                rec.prompt_len = len(out.prompt_token_ids)
            if out.finished:
                rec.end = now
    for rid in order:
        rec = records[rid]
        rec.output_tokens, rec.generated_text = tokens[rid], "".join(texts[rid])
        rec.success = rec.end > 0 and tokens[rid] > 0
        if not rec.success:
            rec.error = "no generated tokens" if rec.end > 0 else "engine never finished it"
    return [records[rid] for rid in order]


def run_offline_bench(cfg: OfflineBenchConfig) -> dict[str, Any]:
    LLM, SamplingParams = _import_engine()

    def build(max_num_seqs: int | None):
        kwargs = dict(cfg.engine_args)
        if max_num_seqs:
            kwargs["max_num_seqs"] = max_num_seqs
        return LLM(model=cfg.model, **kwargs)

    # The first engine is built before the dataset: its tokenizer measures the prompts.
    llm = build(cfg.max_num_seqs[0])
    tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else getattr(llm, "tokenizer", None)
    try:
        requests = load_dataset(cfg.dataset, cfg.num_prompts, cfg.input_len, cfg.output_len,
                                cfg.range_ratio, tokenizer, cfg.seed)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    # Exact token ids when the dataset has them (random), so the engine sees the intended lengths.
    prompts: list[Any] = [r.prompt_token_ids or r.prompt for r in requests]
    if any(isinstance(p, str) for p in prompts):
        prompts = [r.prompt for r in requests]
    params = [SamplingParams(temperature=cfg.temperature, max_tokens=r.output_len,
                             ignore_eos=cfg.ignore_eos, seed=cfg.seed) for r in requests]

    monitor = GpuMonitor(cfg.gpu_interval_s) if cfg.gpu_monitor is not False else None
    result: dict[str, Any] = {
        "kind": "offline",
        "label": cfg.label or f"offline {cfg.model or 'default'}",
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "base_url": None,
        "endpoint": None,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "config": dict(asdict(cfg), request_rate="inf"),
        "gpu": {"available": bool(monitor and monitor.available),
                "note": monitor.note if monitor else "GPU monitor off (--no-gpu-monitor)",
                "devices": monitor.device_names if monitor else []},
        "points": [],
        "gpu_samples": [],
    }
    t0 = time.perf_counter()
    if monitor:
        monitor.start()
    try:
        for max_num_seqs in cfg.max_num_seqs:
            if llm is None:
                llm = build(max_num_seqs)
            # One short request first: it tells whether the step driver fits this engine's
            # internals (they may change; generate() is the stable fallback) and warms it up.
            probe = SamplingParams(temperature=0.0, max_tokens=4 if cfg.warmup else 1)
            use_steps = _has_step_api(llm)
            if use_steps:
                try:
                    _run_stepping(llm, prompts[:1], [probe], requests[:1])
                except (TypeError, AttributeError, ValueError) as exc:
                    log.warning("engine step API did not fit (%s); using LLM.generate: no ITL",
                                exc)
                    use_steps = False
            if not use_steps and cfg.warmup:
                llm.generate([prompts[0]], probe)
            start = time.perf_counter()
            if use_steps:
                records = _run_stepping(llm, prompts, params, requests)
                end = time.perf_counter()
            else:
                clock_offset = time.perf_counter() - time.monotonic()
                outputs = llm.generate(prompts, params)
                end = time.perf_counter()
                records = _records_from_outputs(outputs, requests, clock_offset)
            summary = summarize(records, end - start, cfg.slo or None)
            result["points"].append({
                "max_concurrency": max_num_seqs,
                "request_rate": "inf",
                "start_s": start - t0,
                "end_s": end - t0,
                "summary": asdict(summary),
                "gpu": asdict(monitor.stats(start, end)) if monitor and monitor.available else None,
                "records": [_record_json(r, t0) for r in records],
            })
            llm = None  # free the engine before the next one is built
            gc.collect()
            _empty_cuda_cache()
    finally:
        if monitor:
            monitor.stop()
    if monitor:
        result["gpu_samples"] = monitor.timeline(t0)
    return result


def _empty_cuda_cache() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass

"""`autoglm-serve tune`: find the server settings with the best goodput under an SLO.

For each candidate (max-num-seqs, max-num-batched-tokens, gpu-memory-utilization, chunked
prefill) it starts our server, waits for GET /health, runs a short `bench serve` of the chosen
dataset, and stops the server. A candidate meets the SLO when at least --slo-attainment of its
requests did; among those the best goodput wins. It stops trying when the time budget is spent
and prints the winner as a ready `autoglm-serve serve ...` command with the table of all tries.
"""

from __future__ import annotations

import asyncio
import itertools
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autoglm_serve.bench.runner import BenchError, ServeBenchConfig, run_serve_bench
from autoglm_serve.bench.server_process import ServerProcess, free_port


@dataclass(frozen=True)
class Candidate:
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    chunked_prefill: bool

    def serve_args(self) -> list[str]:
        return [
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}",
            "--enable-chunked-prefill" if self.chunked_prefill else "--no-enable-chunked-prefill",
        ]


@dataclass
class TuneConfig:
    model: str | None
    slo: dict[str, float]
    budget_minutes: float = 30.0
    slo_attainment: float = 0.9  # share of requests that must meet the SLO
    max_num_seqs: list[int] = field(default_factory=lambda: [64, 128, 256])
    max_num_batched_tokens: list[int] = field(default_factory=lambda: [4096, 8192, 16384])
    gpu_memory_utilization: list[float] = field(default_factory=lambda: [0.9])
    chunked_prefill: list[bool] = field(default_factory=lambda: [True, False])
    serve_command: list[str] = field(default_factory=list)  # default: default_serve_command()
    extra_serve_args: list[str] = field(default_factory=list)
    port: int = 0  # 0: a free port
    startup_timeout_s: float = 900.0
    bench: ServeBenchConfig | None = None  # dataset, load and client settings of each try
    log_dir: str | None = None


@dataclass
class TuneTrial:
    candidate: Candidate
    status: str  # ok | failed to start | benchmark failed
    goodput: float | None = None
    attainment: float | None = None  # share of requests within the SLO, at the best point
    best_concurrency: int | None = None
    output_throughput: float | None = None
    mean_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    failed_requests: int = 0
    seconds: float = 0.0
    note: str = ""


def default_serve_command() -> list[str]:
    exe = shutil.which("autoglm-serve")
    return [exe, "serve"] if exe else [sys.executable, "-m", "autoglm_serve.cli", "serve"]


def candidates(cfg: TuneConfig) -> list[Candidate]:
    """The grid, ordered so that a short budget still tries varied settings: chunked prefill on
    first (the usual winner), then by descending batch size."""
    grid = [Candidate(s, t, g, c) for c, s, t, g in itertools.product(
        sorted(cfg.chunked_prefill, reverse=True), sorted(cfg.max_num_seqs, reverse=True),
        sorted(cfg.max_num_batched_tokens, reverse=True), cfg.gpu_memory_utilization)]
    return grid


def _score(trial: TuneTrial, result: dict[str, Any]) -> None:
    best = None
    for p in result["points"]:
        s = p["summary"]
        total = s["completed"] + s["failed"]
        if total == 0:
            continue
        attainment = (s["goodput"] or 0.0) * s["duration_s"] / total
        key = (s["goodput"] or 0.0, attainment)
        if best is None or key > best[0]:
            best = (key, p, attainment)
    if best is None:
        trial.status, trial.note = "benchmark failed", "no requests ran"
        return
    _, p, attainment = best
    s = p["summary"]
    trial.goodput, trial.attainment = s["goodput"], attainment
    trial.best_concurrency = p.get("max_concurrency")
    trial.output_throughput = s["output_throughput"]
    trial.mean_ttft_ms, trial.mean_tpot_ms = s["ttft_ms"]["mean"], s["tpot_ms"]["mean"]
    trial.failed_requests = sum(q["summary"]["failed"] for q in result["points"])
    if trial.failed_requests:
        reasons = {r for q in result["points"] for r in q["summary"]["failure_reasons"]}
        trial.note = "; ".join(sorted(reasons))[:200]


def run_trial(cfg: TuneConfig, cand: Candidate, log_dir: Path) -> TuneTrial:
    t_start = time.monotonic()
    trial = TuneTrial(cand, "ok")
    port = cfg.port or free_port()
    cmd = (cfg.serve_command or default_serve_command()) + ([cfg.model] if cfg.model else []) + [
        "--port", str(port)] + cand.serve_args() + cfg.extra_serve_args
    log_path = log_dir / f"server-{cand.max_num_seqs}-{cand.max_num_batched_tokens}-" \
                         f"{cand.gpu_memory_utilization:g}-{int(cand.chunked_prefill)}.log"
    server = ServerProcess(cmd, port, log_path).spawn()   # a start that fails is a result
    try:
        why = server.wait_healthy(cfg.startup_timeout_s)
        if why is not None:
            trial.status, trial.note = "failed to start", why
            return trial
        assert cfg.bench is not None
        bench = replace(cfg.bench, client=replace(cfg.bench.client, base_url=server.base_url),
                        slo=cfg.slo, progress=False, label=f"tune {cand}")
        try:
            result = asyncio.run(run_serve_bench(bench))
        except BenchError as exc:
            trial.status, trial.note = "benchmark failed", str(exc)[:300]
            return trial
        _score(trial, result)
        return trial
    finally:
        server.stop()
        trial.seconds = time.monotonic() - t_start


def tune(cfg: TuneConfig, echo=print) -> tuple[TuneTrial | None, list[TuneTrial]]:
    if not cfg.slo:
        raise BenchError("tune needs --slo, e.g. --slo ttft:2000,tpot:100")
    log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix="autoglm-tune-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + cfg.budget_minutes * 60
    trials: list[TuneTrial] = []
    grid = candidates(cfg)
    for i, cand in enumerate(grid):
        # Each try costs about as long as the slowest so far; do not start one that cannot finish.
        longest = max((t.seconds for t in trials), default=0.0)
        if time.monotonic() + longest > deadline:
            echo(f"budget spent after {len(trials)} of {len(grid)} candidates")
            break
        echo(f"[{i + 1}/{len(grid)}] {' '.join(cand.serve_args())}")
        trial = run_trial(cfg, cand, log_dir)
        trials.append(trial)
        if trial.status == "ok":
            echo(f"    ok: goodput {trial.goodput or 0.0:.2f} req/s, SLO met by "
                 f"{_pct(trial.attainment)} of requests ({trial.seconds:.0f} s)"
                 + (f"; failures: {trial.note}" if trial.note else ""))
        else:
            echo(f"    {trial.status} ({trial.seconds:.0f} s): {trial.note}")
    ok = [t for t in trials if t.status == "ok" and (t.attainment or 0) >= cfg.slo_attainment]
    best = max(ok, key=lambda t: (t.goodput or 0.0, t.output_throughput or 0.0), default=None)
    return best, trials


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def trials_table(trials: list[TuneTrial], best: TuneTrial | None) -> str:
    header = ["", "max-num-seqs", "max-num-batched-tokens", "gpu-mem-util", "chunked prefill",
              "status", "goodput (req/s)", "SLO met", "at concurrency", "output tok/s",
              "mean TTFT (ms)", "mean TPOT (ms)", "failed", "seconds"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for t in trials:
        c = t.candidate
        f = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        lines.append("| " + " | ".join([
            "★" if t is best else "", str(c.max_num_seqs), str(c.max_num_batched_tokens),
            f"{c.gpu_memory_utilization:g}", "on" if c.chunked_prefill else "off", t.status,
            f(t.goodput, 2), _pct(t.attainment),
            "-" if t.status != "ok" else str(t.best_concurrency or "∞"),
            f(t.output_throughput), f(t.mean_ttft_ms), f(t.mean_tpot_ms, 2),
            str(t.failed_requests), f"{t.seconds:.0f}",
        ]) + " |")
    return "\n".join(lines)


def serve_command_line(cfg: TuneConfig, best: Candidate) -> str:
    parts = ["autoglm-serve", "serve"] + ([cfg.model] if cfg.model else []) + best.serve_args()
    return shlex.join(parts + cfg.extra_serve_args)

"""Reports of a benchmark result: the Markdown table the deployment guides print, and the JSON file.

Everything here reads the JSON-ready result dict, so a result loaded from disk (for `bench
compare`) renders exactly like a fresh one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

RESULT_FILE = "results.json"
TABLE_FILE = "summary.md"


def _f(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value * scale:.{digits}f}"


def _concurrency(point: dict[str, Any]) -> str:
    c = point.get("max_concurrency")
    return str(c) if c else "∞"


def point_row(point: dict[str, Any], show_goodput: bool, show_agent: bool) -> list[str]:
    s = point["summary"]
    gpu = point.get("gpu") or {}
    row = [
        _concurrency(point),
        f"{s['completed']}/{s['failed']}",
        _f(s["e2el_ms"]["mean"], 2, 1e-3),
        _f(s["e2el_ms"]["p99"], 2, 1e-3),
        _f(s["ttft_ms"]["mean"]),
        _f(s["ttft_ms"]["p99"]),
        _f(s["tpot_ms"]["mean"], 2),
        _f(s["tpot_ms"]["p99"], 2),
        _f(s["output_throughput"]),
        _f(s["total_token_throughput"]),
        _f(s["request_throughput"], 2),
    ]
    if show_goodput:
        row.append(_f(s.get("goodput"), 2))
    if show_agent:
        row.append(_f((point.get("phone_agent") or {}).get("agent_steps_per_s"), 2))
    util = "-" if gpu.get("util_mean") is None else \
        f"{gpu['util_mean']:.0f} / {gpu['util_p50']:.0f} / {gpu['util_p99']:.0f}"
    row += [util, _f(gpu.get("mem_peak_mib"), 1, 1 / 1024)]
    return row


def table_header(show_goodput: bool, show_agent: bool) -> list[str]:
    cols = ["concurrency", "ok/failed", "mean latency (s)", "p99 latency (s)", "mean TTFT (ms)",
            "p99 TTFT (ms)", "mean TPOT (ms)", "p99 TPOT (ms)", "output tok/s", "total tok/s",
            "req/s"]
    if show_goodput:
        cols.append("goodput (req/s)")
    if show_agent:
        cols.append("agent steps/s")
    return cols + ["GPU util mean / p50 / p99 (%)", "GPU mem peak (GiB)"]


def markdown_rows(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown_report(result: dict[str, Any]) -> str:
    """The closing report: what ran, the table, GPU notes, failures with their reasons."""
    points = result["points"]
    show_goodput = any(p["summary"].get("goodput") is not None for p in points)
    show_agent = any(p.get("phone_agent") for p in points)
    cfg = result.get("config", {})
    out = [f"## {result.get('label', '')}: {result.get('model', '')}", ""]
    where = result.get("base_url") or "offline engine"
    endpoint = result.get("endpoint") or ""
    out.append(f"{where}{endpoint}, dataset `{result.get('dataset')}`, request rate "
               f"{cfg.get('request_rate', '-')}, {result.get('started_at', '')}")
    if cfg.get("slo"):
        out.append("goodput SLO (ms): " + ", ".join(f"{k} ≤ {v:g}" for k, v in cfg["slo"].items()))
    out.append("")
    rows = [point_row(p, show_goodput, show_agent) for p in points]
    out.append(markdown_rows(table_header(show_goodput, show_agent), rows))
    out.append("")
    gpu = result.get("gpu") or {}
    if gpu.get("available"):
        out.append("GPU: " + ", ".join(gpu.get("devices") or []) + " (NVML utilization: share of "
                   "time a kernel ran; memory: peak used on one device)")
    else:
        out.append(f"GPU: not measured ({gpu.get('note') or 'no GPU'})")
    for p in points:
        agent = p.get("phone_agent")
        if agent:
            by_step = ", ".join(f"{k}: {v:.0f}" for k, v in agent["mean_latency_ms_by_step"].items())
            out.append(f"- phone agent at concurrency {_concurrency(p)}: {agent['agents']} agents × "
                       f"{agent['steps']} steps, {agent['steps_completed']} steps and "
                       f"{agent['episodes_completed']} episodes completed; mean latency by step "
                       f"(ms): {by_step or '-'}")
    failures = [(p, p["summary"]["failure_reasons"]) for p in points if p["summary"]["failed"]]
    if failures:
        out += ["", "Failures:"]
        for p, reasons in failures:
            for reason, n in reasons.items():
                out.append(f"- concurrency {_concurrency(p)}: {n} × {reason}")
    sources = {k for p in points for k in p["summary"].get("output_tokens_source", {})}
    if sources - {"usage"}:
        out.append("")
        out.append("Note: the server sent no usage for some requests; their output tokens were "
                   "counted by " + " / ".join(sorted(sources - {"usage"})) + ".")
    return "\n".join(out) + "\n"


def write_result(result: dict[str, Any], out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULT_FILE
    path.write_text(json.dumps(result, indent=1, allow_nan=False, default=_json_default))
    (out / TABLE_FILE).write_text(markdown_report(result))
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def load_result(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / RESULT_FILE
    result = json.loads(p.read_text())
    result.setdefault("label", p.parent.name if p.name == RESULT_FILE else p.stem)
    return result

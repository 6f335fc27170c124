"""PNG plots of benchmark results: the latency–throughput curve of a sweep (one line per run, so
`bench compare` reuses it) and the GPU utilization / memory / power timeline of one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402


def _x_concurrency(point: dict[str, Any]) -> int:
    """The sweep's concurrency, or the observed peak when it was unlimited."""
    return point.get("max_concurrency") or point["summary"]["max_concurrent_requests"] or 1


def concurrency_label(point: dict[str, Any]) -> str:
    """"c=8" for a limited level; an unlimited one is plotted at its observed peak but named
    "c=∞" (the peak in brackets), so it is not mistaken for a sweep level of that size."""
    limit = point.get("max_concurrency")
    if limit:
        return f"c={limit}"
    return f"c=∞ (peak {_x_concurrency(point)})"


def _ok_points(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in run["points"] if p["summary"]["completed"] > 0]


def plot_latency_throughput(runs: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """E2E latency against output throughput (each point a concurrency level), TTFT and TPOT
    against concurrency, and GPU utilization against concurrency when it was measured."""
    has_gpu = any((p.get("gpu") or {}).get("util_mean") is not None
                  for r in runs for p in r["points"])
    ncols = 4 if has_gpu else 3
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 4.6))
    ax_lat, ax_ttft, ax_tpot = axes[:3]
    for i, run in enumerate(runs):
        color = f"C{i}"
        label = run.get("label") or f"run {i + 1}"
        pts = _ok_points(run)
        if not pts:
            continue
        conc = [_x_concurrency(p) for p in pts]
        tput = [p["summary"]["output_throughput"] for p in pts]
        for ax, key, scale, x in (
            (ax_lat, "e2el_ms", 1e-3, tput), (ax_ttft, "ttft_ms", 1.0, conc),
            (ax_tpot, "tpot_ms", 1.0, conc),
        ):
            mean = [p["summary"][key]["mean"] for p in pts]
            p99 = [p["summary"][key]["p99"] for p in pts]
            ax.plot(x, [v * scale if v is not None else float("nan") for v in mean], "o-",
                    color=color, label=f"{label} mean")
            ax.plot(x, [v * scale if v is not None else float("nan") for v in p99], "s--",
                    color=color, alpha=0.6, label=f"{label} p99")
        for x, y, p in zip(tput, [p["summary"]["e2el_ms"]["mean"] for p in pts], pts):
            if y is not None:
                ax_lat.annotate(concurrency_label(p), (x, y * 1e-3), textcoords="offset points",
                                xytext=(4, 4), fontsize=8, color=color)
        if has_gpu:
            util = [(p.get("gpu") or {}).get("util_mean") for p in pts]
            axes[3].plot(conc, [u if u is not None else float("nan") for u in util], "o-",
                         color=color, label=label)
    ax_lat.set(xlabel="output throughput (tok/s)", ylabel="E2E latency (s)",
               title="latency vs throughput")
    ax_ttft.set(xlabel="concurrency", ylabel="TTFT (ms)", title="time to first token")
    ax_tpot.set(xlabel="concurrency", ylabel="TPOT (ms)", title="time per output token")
    if has_gpu:
        axes[3].set(xlabel="concurrency", ylabel="GPU utilization (%)", ylim=(0, 105),
                    title="GPU utilization (mean)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    points = [p for r in runs for p in _ok_points(r)]
    ticks = sorted({_x_concurrency(p) for p in points})
    limited = {p["max_concurrency"] for p in points if p.get("max_concurrency")}
    for ax in axes[1:]:
        ax.set_xscale("log", base=2)
        if ticks:  # label the sweep's own levels, not powers of two; ∞ at an unlimited peak
            ax.set_xticks(ticks, [str(t) if t in limited else f"∞ ({t})" for t in ticks])
            ax.minorticks_off()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_gpu_timeline(result: dict[str, Any], path: str | Path) -> Path | None:
    """Utilization, memory and power over the run, sweep points shaded. None without samples."""
    samples = result.get("gpu_samples") or []
    if not samples:
        return None
    devices = sorted({s["device"] for s in samples})
    fig, (ax_u, ax_m, ax_p) = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    for d in devices:
        ss = [s for s in samples if s["device"] == d]
        t = [s["time"] for s in ss]
        color = f"C{d % 10}"
        ax_u.plot(t, [s["util_pct"] for s in ss], lw=1, color=color, label=f"GPU {d} util")
        ax_u.plot(t, [s["mem_util_pct"] for s in ss], lw=0.8, ls="--", alpha=0.6, color=color,
                  label=f"GPU {d} memory controller")
        ax_m.plot(t, [s["mem_used_mib"] / 1024 for s in ss], lw=1, color=color, label=f"GPU {d}")
        ax_p.plot(t, [s["power_w"] if s["power_w"] is not None else float("nan") for s in ss],
                  lw=1, color=color, label=f"GPU {d} power")
    ax_c = ax_p.twinx()
    for d in devices:
        ss = [s for s in samples if s["device"] == d]
        ax_c.plot([s["time"] for s in ss],
                  [s["sm_clock_mhz"] if s["sm_clock_mhz"] is not None else float("nan")
                   for s in ss], lw=0.8, ls=":", color="gray", label=f"GPU {d} SM clock")
    for i, p in enumerate(result["points"]):
        for ax in (ax_u, ax_m, ax_p):
            ax.axvspan(p["start_s"], p["end_s"], color=f"C{i % 10}", alpha=0.08)
        c = p.get("max_concurrency") or "∞"
        ax_u.text((p["start_s"] + p["end_s"]) / 2, 102, f"c={c}", ha="center", fontsize=8)
    ax_u.set(ylabel="utilization (%)", ylim=(0, 110),
             title=f"GPU during the run: {result.get('label', '')}")
    ax_m.set(ylabel="memory used (GiB)")
    ax_p.set(ylabel="power (W)", xlabel="time since start (s)")
    ax_c.set_ylabel("SM clock (MHz)")
    for ax in (ax_u, ax_m, ax_p):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

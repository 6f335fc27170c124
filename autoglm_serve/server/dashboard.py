"""/dashboard: a live page of the server's state (static/dashboard.html, plain JS drawing on
canvas: no build step, nothing fetched from outside the server), and /dashboard/data, the JSON
it polls.

The JSON is the Prometheus registry's own samples (server/metrics.py), read the way a scrape
reads them, so the page and Grafana show the same numbers and nothing is counted twice. The
page turns counters into rates and histograms into windowed percentiles itself, from the
differences between its polls, as Prometheus' rate() and histogram_quantile() do.
"""
from __future__ import annotations

import math
import time
from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from autoglm_serve.server.metrics import ServerMetrics

DASHBOARD_HTML = files("autoglm_serve.server").joinpath("static", "dashboard.html")


def snapshot(metrics: ServerMetrics, model_name: str) -> dict:
    """{"values": sample name -> value summed over its labels, "histograms": family -> its
    cumulative buckets, "gpus": GPU index -> sample name -> value}."""
    values: dict[str, float] = {}
    histograms: dict[str, dict] = {}
    gpus: dict[str, dict[str, float]] = {}
    for family in metrics.registry.collect():
        if family.type == "histogram":
            buckets: dict[float, float] = {}
            total = count = 0.0
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_sum"):
                    total += s.value
                elif s.name.endswith("_count"):
                    count += s.value
            bounds = sorted(buckets)
            histograms[family.name] = {
                "le": [b if math.isfinite(b) else None for b in bounds],   # None: +Inf
                "cumulative": [buckets[b] for b in bounds], "sum": total, "count": count}
            continue
        for s in family.samples:
            if "gpu" in s.labels:
                gpus.setdefault(s.labels["gpu"], {})[s.name] = s.value
            else:
                values[s.name] = values.get(s.name, 0.0) + s.value
    return {"time": time.time(), "model": model_name, "values": values,
            "histograms": histograms,
            "gpus": [{"gpu": k, **v} for k, v in sorted(gpus.items())]}


def add_dashboard_routes(app: FastAPI, metrics: ServerMetrics, model_name: str) -> None:
    page = DASHBOARD_HTML.read_text(encoding="utf-8")

    @app.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard():
        return HTMLResponse(page, headers={"Cache-Control": "no-cache"})

    @app.get("/dashboard/data", include_in_schema=False)
    async def dashboard_data():
        return snapshot(metrics, model_name)

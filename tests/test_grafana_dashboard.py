"""deploy/grafana/autoglm-serve.json asks only for metrics the server serves: each name in its
queries is in /metrics of the embedded-default server, or, for what that CPU text model has
not, among the GPU gauges (server/gpu_stats.py) or the vision models' encoder cache (served by
the tiny GLM-4.1V server in tests/test_server_vision.py, which checks those names)."""
from __future__ import annotations

import json
import re

import httpx

from autoglm_serve.server.gpu_stats import GpuStats
from tests.server_fixtures import ROOT, parse_metrics

DASHBOARD = ROOT / "deploy" / "grafana" / "autoglm-serve.json"
ENCODER_CACHE = {"autoglm:encoder_cache_hits_total", "autoglm:encoder_cache_queries_total"}


def dashboard_metric_names() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    return {m for e in exprs for m in re.findall(r"\b(?:vllm|autoglm):[a-z0-9_:]+", e)}


def served_names(metrics_text: str) -> set[str]:
    return {k.split("{")[0] for k in parse_metrics(metrics_text)}


def gpu_gauge_names() -> set[str]:
    # the real collector with no GPU handles: its families, without samples
    return {f.name for f in GpuStats(None, []).collect({"model_name": "m", "engine": "0"})}


def test_every_panel_queries_a_served_metric(embedded_server):
    names = dashboard_metric_names()
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len(panels) >= 10 and len(names) >= 15
    served = served_names(httpx.get(embedded_server.url("/metrics"), timeout=10).text)
    missing = names - served - gpu_gauge_names() - ENCODER_CACHE
    assert not missing, f"the dashboard queries metrics /metrics does not serve: {missing}"
    assert {"autoglm:gpu_utilization_perc", "autoglm:gpu_power_watts"} <= names
    assert ENCODER_CACHE <= names

"""/metrics of the ingress: every replica's Prometheus series with a ``replica`` label, one
``autoglm:replica_info`` series per replica (its pid and host), and the router's decisions.

The replicas' text comes from their last routing-stats report (replica.py), so it is at most
one report period old.
"""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from autoglm_serve.cluster.routing_state import REGISTRY


class _ReplicasCollector:
    def __init__(self, reports: list[dict]):
        self.reports = [r for r in reports if "metrics" in r]

    def collect(self):
        info = GaugeMetricFamily("autoglm:replica_info", "Engine replicas serving now (1 each).",
                                 labels=["replica", "pid", "node"])
        families: dict[str, Metric] = {}
        for report in self.reports:
            info.add_metric([report["replica"], str(report["pid"]), report["node"]], 1)
            for family in text_string_to_metric_families(report["metrics"]):
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type))
                merged.samples += [Sample(s.name, {**s.labels, "replica": report["replica"]},
                                          s.value, s.timestamp, s.exemplar)
                                   for s in family.samples]
        yield info
        yield from families.values()


def render_cluster_metrics(reports: list[dict]) -> bytes:
    return generate_latest(REGISTRY) + generate_latest(_ReplicasCollector(reports))

"""What the routers of this process (the ingress) share with it: their decision counters and
the live routers themselves, for /metrics.

Kept apart from router.py because Ray Serve pickles the router's module by value into every
process that routes; state living there would be copied (or fail to pickle), while this module
is imported, once per process.
"""
from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics

disable_created_metrics()   # as server/metrics.py: no *_created series

REGISTRY = CollectorRegistry(auto_describe=False)
ROUTING_DECISIONS = Counter(
    "autoglm:router_decisions", "Requests routed by the conversation-affinity router, by "
    "decision: affinity (to the replica holding the prefix), fallback (that replica was too "
    "loaded or full), new (prefix seen nowhere), no_prefix (nothing to match).",
    ["decision"], registry=REGISTRY)
for _decision in ("affinity", "fallback", "new", "no_prefix"):
    ROUTING_DECISIONS.labels(_decision)

ACTIVE_ROUTERS: weakref.WeakSet = weakref.WeakSet()


def replica_reports() -> list[dict]:
    """What each live replica last reported to the routers (its record_routing_stats)."""
    return [dict(replica.routing_stats or {}) for router in list(ACTIVE_ROUTERS)
            for replica in router.curr_replicas.values()]

"""Ray Serve request router that keeps a conversation on the replica holding its prefix cache.

Each request carries its prefix keys (affinity.py). The replica that served the longest of them
gets the request while its load (requests in flight from this router) is within
``imbalance_threshold`` of the least loaded replica; past that, or for a conversation seen
nowhere, the least loaded replica takes it. Ray Serve still does the rest: a full replica is
skipped for the next rank, dead replicas leave the candidate list, requests queue in the
router while none has room.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from typing import Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter

# The module, not its names: Ray pickles this file by value (routing_state.py says why).
from autoglm_serve.cluster import routing_state


def prefix_keys_of(pending_request: Optional[PendingRequest]) -> list[str]:
    if pending_request is None:
        return []
    for arg in pending_request.args:
        keys = getattr(arg, "prefix_keys", None)
        if keys is not None:
            return keys
    return []


# No shared base class or mixin here: Ray pickles this module by value, and cloudpickle 3
# rebuilds a by-value base class without its methods; each router registers itself.
class PowerOfTwoRouter(PowerOfTwoChoicesRequestRouter):
    """Ray Serve's default routing (the less loaded of two random replicas), for comparison."""

    def initialize_state(self, **kwargs):
        super().initialize_state(**kwargs)
        routing_state.ACTIVE_ROUTERS.add(self)


class RandomRouter(RequestRouter):
    """Any replica, uniformly (a full one is skipped for the others): the baseline that
    routing for affinity is measured against."""

    def initialize_state(self, **kwargs):
        routing_state.ACTIVE_ROUTERS.add(self)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: Optional[PendingRequest] = None
                              ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        shuffled = random.sample(candidate_replicas, len(candidate_replicas))
        return [shuffled[:1], shuffled[1:]] if shuffled else []


class ConversationAffinityRouter(RequestRouter):
    def initialize_state(self, imbalance_threshold: int = 8, max_keys: int = 200_000):
        self.imbalance_threshold = imbalance_threshold
        self.max_keys = max_keys
        self._owner: OrderedDict[str, ReplicaID] = OrderedDict()   # LRU: prefix key → replica
        self._in_flight: dict[ReplicaID, set[str]] = {}
        # chosen but not yet routed (counted as load, so a burst of new conversations spreads)
        self._intended: dict[str, tuple[ReplicaID, Optional[ReplicaID]]] = {}
        # conversations each replica was given: breaks ties of load, so that one-at-a-time
        # new conversations still spread
        self._conversations: dict[ReplicaID, int] = {}
        routing_state.ACTIVE_ROUTERS.add(self)   # the ingress's /metrics finds it there

    def _load(self, replica_id: ReplicaID) -> int:
        pending = sum(1 for target, _ in self._intended.values() if target == replica_id)
        return len(self._in_flight.get(replica_id, ())) + pending

    def _owner_among(self, keys: list[str], candidates: dict) -> Optional[RunningReplica]:
        for key in reversed(keys):   # the longest prefix first
            owner = candidates.get(self._owner.get(key))
            if owner is not None:
                return owner
        return None

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: Optional[PendingRequest] = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_load = sorted(candidate_replicas, key=lambda r: (
            self._load(r.replica_id), self._conversations.get(r.replica_id, 0)))
        if pending_request is None:
            return [by_load]
        # every rank full: wait with Ray's backoff rather than retrying at once
        pending_request.routing_context.should_backoff = True
        request_id = pending_request.metadata.internal_request_id
        self._intended.pop(request_id, None)   # a retry: its earlier choice no longer counts
        owner = self._owner_among(prefix_keys_of(pending_request),
                                  {r.replica_id: r for r in candidate_replicas})
        first = by_load[0]
        if owner is not None and (self._load(owner.replica_id) - self._load(first.replica_id)
                                  <= self.imbalance_threshold):
            first = owner
        self._intended[request_id] = (first.replica_id,
                                      owner.replica_id if owner is not None else None)
        return [[first], [r for r in by_load if r is not first]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result) -> None:
        request_id = pending_request.metadata.internal_request_id
        _, owner = self._intended.pop(request_id, (None, None))
        keys = prefix_keys_of(pending_request)
        if not keys:
            decision = "no_prefix"
        elif owner is None:
            decision = "new"
            self._conversations[replica_id] = self._conversations.get(replica_id, 0) + 1
        else:
            decision = "affinity" if owner == replica_id else "fallback"
        routing_state.ROUTING_DECISIONS.labels(decision).inc()
        self._in_flight.setdefault(replica_id, set()).add(request_id)
        for key in keys:   # this replica now holds these prefixes (or will, once prefilled)
            self._owner[key] = replica_id
            self._owner.move_to_end(key)
        while len(self._owner) > self.max_keys:
            self._owner.popitem(last=False)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._in_flight.get(replica_id, set()).discard(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID):
        super().on_replica_actor_died(replica_id)
        self._in_flight.pop(replica_id, None)

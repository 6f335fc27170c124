"""The cluster's HTTP entry: every request goes, through Ray Serve's handle (and so through the
conversation-affinity router), to an engine replica, whose app answers it; /metrics is
answered here, for all replicas.

A replica that dies before the response's first bytes reached the client costs nothing: the
request is sent again, to another replica (Ray takes the dead one out of the router). One that
dies mid-stream ends the stream with an OpenAI error event and [DONE]; a half-sent JSON body
cannot be mended, so the connection is closed.
"""
from __future__ import annotations

import asyncio
import logging

from prometheus_client import Counter
from ray.exceptions import ActorUnavailableError, RayActorError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from autoglm_serve.cluster.affinity import request_prefix_keys
from autoglm_serve.cluster.forwarding import ForwardedRequest
from autoglm_serve.cluster.metrics import render_cluster_metrics
from autoglm_serve.cluster.routing_state import REGISTRY, replica_reports
from autoglm_serve.server.errors import OpenAIError

logger = logging.getLogger("autoglm_serve.cluster")
REPLICA_LOST = (RayActorError, ActorUnavailableError)
RETRIES = Counter("autoglm:ingress_retries", "Requests sent again to another replica because "
                  "theirs died before answering.", registry=REGISTRY)
LOST_STREAMS = Counter("autoglm:ingress_lost_streams", "Responses cut off by the death of "
                       "their replica after they had begun.", registry=REGISTRY)


def _is_last(message: dict) -> bool:
    return message["type"] == "http.response.body" and not message.get("more_body", False)


async def _until_first_bytes(stream) -> list[dict]:
    """The response's start and its first non-empty body part (or its end): until then nothing
    has reached the client and the request can be sent again."""
    head = []
    async for message in stream:
        head.append(message)
        if message["type"] == "http.response.body" and (message.get("body") or
                                                        _is_last(message)):
            return head
    return head


class ReplayedResponse(Response):
    """A replica's ASGI messages, replayed to the ingress's client as they come."""

    def __init__(self, head: list[dict], stream):
        self.head, self.stream = head, stream
        start = head[0] if head else {"headers": []}
        self.is_sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                          for k, v in start.get("headers", ()))

    async def __call__(self, scope, receive, send):
        done = bool(self.head) and _is_last(self.head[-1])
        try:
            for message in self.head:
                await send(message)
            if done:
                return
            try:
                async for message in self.stream:
                    await send(message)
                    done = _is_last(message)
            except REPLICA_LOST as exc:
                LOST_STREAMS.inc()
                logger.warning("a replica died mid-response: %s", exc)
                tail = b""
                if self.is_sse:
                    tail = (OpenAIError(503, "the replica serving this stream stopped; the "
                                        "completion is incomplete", code="replica_lost").sse()
                            + "data: [DONE]\n\n").encode()
                await send({"type": "http.response.body", "body": tail, "more_body": False})
                done = True
        finally:
            if not done:
                self.stream.cancel()


class Ingress:
    def __init__(self, replicas, max_attempts: int = 3):
        self.replicas = replicas.options(stream=True)
        self.max_attempts = max_attempts

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if path == "/metrics" and request.method == "GET":
            return Response(render_cluster_metrics(replica_reports()),
                            media_type="text/plain; version=0.0.4; charset=utf-8")
        body = await request.body()
        forwarded = ForwardedRequest(request.method, path, request.scope.get("query_string", b""),
                                     list(request.scope["headers"]), body,
                                     request_prefix_keys(path, body))
        last_error = None
        for attempt in range(self.max_attempts):
            stream = self.replicas.forward.remote(forwarded)
            try:
                return ReplayedResponse(await _until_first_bytes(stream), stream)
            except REPLICA_LOST as exc:
                stream.cancel()
                last_error = exc
                RETRIES.inc()
                logger.warning("replica lost before answering (attempt %d): %s", attempt + 1,
                               exc)
                await asyncio.sleep(0.1 * (attempt + 1))   # lets Ray drop it from the router
        error = OpenAIError(503, f"no replica could answer: {type(last_error).__name__}",
                            code="replica_lost", headers={"Retry-After": "1"})
        return JSONResponse(error.body(), status_code=503, headers=error.headers)

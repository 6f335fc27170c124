"""One HTTP request carried from the ingress to a replica, and run there through the replica's
own FastAPI app (server/app.py), so routes, validation, errors and streaming are the same as
`serve`. The replica answers with the app's ASGI messages, one by one, which the ingress
replays to its client."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class ForwardedRequest:
    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    prefix_keys: list[str] = field(default_factory=list)   # for the router (affinity.py)


async def run_asgi(app, request: ForwardedRequest,
                   extra_headers: list[tuple[bytes, bytes]] = ()) -> AsyncIterator[dict]:
    """The app's response messages for one request; ``extra_headers`` join its start message.
    Closing the iterator (the ingress's client left) is the app's http.disconnect."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": request.method, "scheme": "http",
             "path": request.path, "raw_path": request.path.encode(),
             "query_string": request.query_string, "root_path": "",
             "headers": request.headers, "client": None, "server": None}
    messages: asyncio.Queue = asyncio.Queue()
    disconnected = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": list(message.get("headers", ())) +
                       list(extra_headers)}
        await messages.put(message)

    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        while (message := await messages.get()) is not None:
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body"):
                break
        if task.done() and task.exception() is not None:
            raise task.exception()
    finally:
        disconnected.set()
        if not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=5)
            except asyncio.TimeoutError:
                task.cancel()

"""The FastAPI application: routes, API-key and body-size guards, cancellation on disconnect."""
from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

import autoglm_serve
from autoglm_serve.engine.async_llm import AsyncLLM
from autoglm_serve.engine.frontend.chat_template import PromptError
from autoglm_serve.server.args import ServerSettings
from autoglm_serve.server.dashboard import add_dashboard_routes
from autoglm_serve.server.errors import OpenAIError, install_error_handlers
from autoglm_serve.server.metrics import ServerMetrics
from autoglm_serve.server.protocol import (ChatCompletionRequest, ChatCompletionResponse,
                                           CompletionRequest, CompletionResponse,
                                           DetokenizeRequest, ErrorResponse, ResponsesRequest,
                                           TokenizeRequest)
from autoglm_serve.server.serving import Serving
from autoglm_serve.server.serving_chat import ChatHandler
from autoglm_serve.server.serving_completions import CompletionHandler
from autoglm_serve.server.serving_responses import ResponsesHandler

# Open without a key: load balancers and Prometheus probe these (vLLM leaves them open too).
# The dashboard too: a browser tab cannot send the bearer key, and it shows what /metrics does.
_OPEN_PATHS = ("/health", "/ping", "/metrics", "/version", "/dashboard")


class BodyLimitMiddleware:
    """413 before any parsing: by Content-Length, or, for a chunked body, by reading it up to
    the limit before the app sees any of it."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        error = OpenAIError(413, f"request body exceeds the server's limit of "
                            f"{self.max_bytes / 2**20:g} MiB (--max-request-body-mb)",
                            code="request_too_large")
        length = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if length is not None:
            if length.isdigit() and int(length) > self.max_bytes:
                return await error.response()(scope, receive, send)
            return await self.app(scope, receive, send)   # the server enforces the length
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return   # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await error.response()(scope, receive, send)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS" \
                or scope["path"].startswith(_OPEN_PATHS):
            return await self.app(scope, receive, send)
        given = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
        auth = given[0] if len(given) == 1 else b""   # two Authorization headers: refused
        if not hmac.compare_digest(auth, self.expected):
            message = "missing API key: send 'Authorization: Bearer <key>'" if not auth \
                else "incorrect API key provided"
            return await OpenAIError(401, message, code="invalid_api_key").response()(
                scope, receive, send)
        return await self.app(scope, receive, send)


class SSEResponse(StreamingResponse):
    """A stream that always closes its generator, so a vanished client's request is aborted
    in the engine at once instead of whenever the generator is garbage-collected."""
    media_type = "text/event-stream"

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def until_disconnect(request: Request, work: Awaitable):
    """Runs a handler, cancelling it (and so its engine request) if the client leaves first."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        return Response(status_code=499)   # nobody reads it; nginx's "client closed request"
    return task.result()


def _respond(result):
    if isinstance(result, Response):
        return result
    if hasattr(result, "__aiter__"):
        return SSEResponse(result, headers={"Cache-Control": "no-cache",
                                            "X-Accel-Buffering": "no"})
    return JSONResponse(result.model_dump(exclude_none=False))


def _ok(model) -> dict:
    return {200: {"model": model, "description": "the completion; with stream: server-sent "
                  "events of its chunks, then data: [DONE]"}}


def build_app(engine: AsyncLLM, settings: ServerSettings, gpu_stats=None) -> FastAPI:
    # Declaring 4XX also keeps FastAPI from documenting its 422, which errors.py turns into 400.
    errors = {"model": ErrorResponse, "description": "an OpenAI-style error"}
    app = FastAPI(title="autoglm-serve", version=autoglm_serve.__version__, docs_url=None,
                  redoc_url=None, responses={"4XX": errors, "5XX": errors})
    install_error_handlers(app)
    metrics = ServerMetrics(engine, settings.served_model_names[0], gpu_stats)
    serving = Serving(engine, settings, metrics)
    chat = ChatHandler(serving)
    completions = CompletionHandler(serving)
    responses = ResponsesHandler(serving, chat)
    created = int(time.time())
    app.state.serving = serving

    @app.get("/health", response_class=Response)   # an empty 200, not JSON
    async def health():
        if engine.dead is not None:
            raise OpenAIError(503, f"the engine has stopped: {engine.dead!r}")
        return Response(status_code=200)

    @app.get("/ping", response_class=Response)
    async def ping():
        return await health()

    @app.get("/version")
    async def version():
        return {"version": autoglm_serve.__version__}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    add_dashboard_routes(app, metrics, settings.served_model_names[0])

    @app.get("/v1/models")
    async def models():
        root = engine.info.model_path
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "autoglm-serve",
             "root": root, "parent": None, "max_model_len": serving.max_model_len,
             "permission": []} for name in settings.served_model_names]}

    @app.post("/v1/chat/completions", responses=_ok(ChatCompletionResponse))
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return _respond(await until_disconnect(request, chat.create(body)))

    @app.post("/v1/completions", responses=_ok(CompletionResponse))
    async def text_completions(body: CompletionRequest, request: Request):
        return _respond(await until_disconnect(request, completions.create(body)))

    @app.post("/v1/responses", responses={200: {"description": "the Response object; with "
                                                "stream: its typed server-sent events"}})
    async def create_response(body: ResponsesRequest, request: Request):
        return _respond(await until_disconnect(request, responses.create(body)))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        serving.model_name(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise OpenAIError(400, "give either prompt or messages", "prompt")
        if body.messages is not None:
            kwargs = dict(body.chat_template_kwargs or {})
            if body.enable_thinking is not None:
                kwargs.setdefault("enable_thinking", body.enable_thinking)
            try:
                text = engine.frontend.render_chat(
                    [m.model_dump(exclude_none=True) for m in body.messages],
                    template_kwargs=kwargs,
                    add_generation_prompt=body.add_generation_prompt).prompt
            except PromptError as exc:
                raise OpenAIError(400, str(exc), exc.param) from exc
            special = bool(body.add_special_tokens)
        else:
            text = body.prompt
            special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = await serving.tokenize(text, special)
        out = {"count": len(ids), "max_model_len": serving.max_model_len, "tokens": ids}
        if body.return_token_strs:
            out["token_strs"] = serving.tokenizer.convert_ids_to_tokens(ids)
        return out

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        serving.model_name(body.model)
        vocab = engine.info.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise OpenAIError(400, f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}",
                              "tokens")
        return {"prompt": serving.tokenizer.decode(body.tokens)}

    # Outermost first: the size check runs before the key check, both before any parsing.
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_body_bytes)
    return app

"""Async streaming client for OpenAI-compatible servers (chat and completions endpoints).

It timestamps every streamed chunk and never raises: a refused request, a timeout, a dropped
connection or a stream with no text all come back as a failed RequestRecord with the reason,
so a dead server ends a benchmark with a report instead of a hang or a traceback.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from autoglm_serve.bench.datasets import BenchRequest
from autoglm_serve.bench.record import RequestRecord


@dataclass
class ClientConfig:
    base_url: str  # e.g. http://127.0.0.1:8000 (with or without /v1)
    model: str
    endpoint: str = "/v1/chat/completions"  # or /v1/completions
    api_key: str | None = None
    temperature: float = 0.0
    ignore_eos: bool = False  # vLLM/SGLang extension; some servers refuse the field
    extra_body: dict[str, Any] = field(default_factory=dict)
    request_timeout_s: float = 600.0  # whole request, first byte to last
    connect_timeout_s: float = 10.0
    seed: int | None = None

    @property
    def is_chat(self) -> bool:
        return "chat" in self.endpoint

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        path = self.endpoint if self.endpoint.startswith("/") else "/" + self.endpoint
        # Accept --base-url with /v1 as well as without it.
        if base.endswith("/v1") and path.startswith("/v1/"):
            path = path[3:]
        return base + path


def build_payload(cfg: ClientConfig, req: BenchRequest) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": cfg.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": cfg.temperature,
    }
    if cfg.is_chat:
        payload["messages"] = req.messages or [{"role": "user", "content": req.prompt}]
        payload["max_completion_tokens"] = req.output_len
    else:
        payload["prompt"] = req.prompt
        payload["max_tokens"] = req.output_len
    if cfg.ignore_eos:
        payload["ignore_eos"] = True
    if cfg.seed is not None:
        payload["seed"] = cfg.seed
    payload.update(cfg.extra_body)
    return payload


def make_http_client(cfg: ClientConfig, max_connections: int) -> httpx.AsyncClient:
    headers = {"Content-Type": "application/json"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=cfg.connect_timeout_s)
    limits = httpx.Limits(max_connections=max(1, max_connections), max_keepalive_connections=None)
    # trust_env=False: a proxy from the environment must not sit between us and the server.
    return httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits, trust_env=False)


def _chunk_text(data: dict[str, Any]) -> str:
    choices = data.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        delta = choice["delta"] or {}
        text = (delta.get("reasoning_content") or delta.get("reasoning") or "") + (
            delta.get("content") or ""
        )
        if not text and delta.get("tool_calls"):
            text = json.dumps(delta["tool_calls"])
        return text
    return choice.get("text") or ""


def _error_text(exc: BaseException) -> str:
    msg = str(exc).strip()
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


async def send_request(
    http: httpx.AsyncClient, cfg: ClientConfig, req: BenchRequest, index: int,
    payload: dict[str, Any] | None = None,
) -> RequestRecord:
    """Send one streaming request and record when each chunk arrived. Never raises."""
    rec = RequestRecord(index=index, prompt_len=req.prompt_len, expected_output_len=req.output_len)
    body = payload if payload is not None else build_payload(cfg, req)
    text_parts: list[str] = []
    rec.start = time.perf_counter()
    try:
        async with asyncio.timeout(cfg.request_timeout_s):
            await _stream(http, cfg, body, rec, text_parts)
    except TimeoutError:
        rec.success, rec.error = False, f"timeout: no complete response after {cfg.request_timeout_s:g} s"
    except httpx.HTTPError as exc:
        rec.success, rec.error = False, _error_text(exc)
    except Exception as exc:  # noqa: BLE001 - any failure is data, not a crash
        rec.success, rec.error = False, _error_text(exc)
    rec.end = time.perf_counter()
    rec.generated_text = "".join(text_parts)
    return rec


async def _stream(
    http: httpx.AsyncClient, cfg: ClientConfig, body: dict[str, Any], rec: RequestRecord,
    text_parts: list[str],
) -> None:
    async with http.stream("POST", cfg.url, json=body) as resp:
        if resp.status_code != 200:
            detail = (await resp.aread()).decode("utf-8", "replace").strip()
            rec.error = f"HTTP {resp.status_code}: {detail[:300]}"
            return
        finished = False
        async for line in resp.aiter_lines():
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith("data:"):
                continue  # blank separators, SSE comments / keep-alives
            data_str = line[5:].strip()
            if data_str == "[DONE]":
                finished = True
                break
            data = json.loads(data_str)
            if "error" in data and not data.get("choices"):
                err = data["error"]
                rec.error = "server error in stream: " + (
                    str(err.get("message", err)) if isinstance(err, dict) else str(err)
                )
                return
            text = _chunk_text(data)
            if text:
                rec.chunk_times.append(now)
                text_parts.append(text)
            for choice in data.get("choices") or []:
                if choice.get("finish_reason"):
                    finished = True
            usage = data.get("usage")
            if usage:
                if usage.get("completion_tokens") is not None:
                    rec.output_tokens = int(usage["completion_tokens"])
                if usage.get("prompt_tokens"):
                    rec.prompt_len = int(usage["prompt_tokens"])
    if not finished:
        rec.error = "stream ended before [DONE] or a finish_reason"
    elif not rec.chunk_times:
        # As vLLM: a response without any text gives no TTFT and counts as failed.
        rec.error = "no generated text in the response"
    else:
        rec.success = True

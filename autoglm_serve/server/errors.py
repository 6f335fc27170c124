"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

Every failure leaves the server as an OpenAIError or through one of the handlers here, so a
client never sees FastAPI's 422 or a traceback; the traceback goes to the server log.
"""
from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.headers = headers or {}
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer", **self.headers} if self.status == 401 \
            else self.headers
        return JSONResponse(self.body(), status_code=self.status, headers=headers)

    def sse(self) -> str:
        """The same error as one server-sent event, for failures after a stream has begun."""
        return f"data: {json.dumps(self.body(), ensure_ascii=False)}\n\n"


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param)


def model_not_found(name: str, served: list[str]) -> OpenAIError:
    return OpenAIError(404, f"The model `{name}` does not exist. Served models: "
                       f"{', '.join(served)}", "model", "model_not_found")


# Fields of SamplingParams whose ValueError message starts with the field's name.
_SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                    "presence_penalty", "repetition_penalty", "seed", "max_tokens",
                    "min_tokens", "logprobs", "stop_token_ids", "stop")


def sampling_error(exc: ValueError, renames: dict[str, str] | None = None) -> OpenAIError:
    """SamplingParams names the field first in its message; that field is the error's param."""
    message = str(exc)
    first = message.split(" ", 1)[0]
    param = first if first in _SAMPLING_FIELDS else None
    if param and renames and param in renames:
        message = renames[param] + message[len(param):]
        param = renames[param]
    return bad_request(message, param)


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "function-after"}


def _client_path(loc) -> str | None:
    """Pydantic's error location minus "body" and union-branch names such as 'str' or
    'list[...]': the path the client wrote, e.g. messages.0.role."""
    parts: list[str] = []
    for p in loc:
        p = str(p)
        if p == "body" or "[" in p or p in _TYPE_NAMES:
            continue
        if parts and parts[-1] == p:   # a tagged union repeats the tag as a location
            continue
        parts.append(p)
    return ".".join(parts) or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    if errors[0].get("type") == "json_invalid":
        err = errors[0]
        return f"Malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}", None
    # Of a union's failed branches, the deepest one is the one the client meant.
    err = max(errors, key=lambda e: len(e.get("loc", ())))
    param = _client_path(err.get("loc", ()))
    if err.get("type") == "missing":
        return f"'{param}' is a required field", param
    if err.get("type") in ("model_attributes_type", "dict_type") and param is None:
        return "the request body must be a JSON object", None
    return f"invalid value for '{param}': {err.get('msg', 'invalid value')}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return OpenAIError(400, message, param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        return OpenAIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        logger.exception("unhandled error while serving a request")
        return OpenAIError(500, f"internal server error ({type(exc).__name__}); see the server "
                           "log").response()

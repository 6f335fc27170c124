"""The messages between the server's front-end and the engine core (on a thread or in a process).

To the core: AddRequests, AbortRequests, Shutdown. From the core: CoreReady once it is built,
then CoreOutputs per step, or CoreFailed when it could not start or stopped on an error.
"""
from __future__ import annotations

from dataclasses import dataclass

from autoglm_serve.engine.core import CoreOutput
from autoglm_serve.engine.core_stats import CoreStats, EngineInfo
from autoglm_serve.engine.request import Request


@dataclass
class AddRequests:
    requests: list[Request]


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class Shutdown:
    pass


@dataclass
class CoreReady:
    info: EngineInfo


@dataclass
class CoreOutputs:
    outputs: list[CoreOutput]
    stats: CoreStats


@dataclass
class CoreFailed:
    error: BaseException     # the exception itself, or a RuntimeError with its text
    traceback: str

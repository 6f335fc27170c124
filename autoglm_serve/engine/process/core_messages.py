"""The messages between the server's front-end and the engine core (on a thread or in a process).

To the core: AddRequests, AbortRequests, Shutdown. From the core: CoreReady once it is built,
then CoreOutputs per step, or CoreFailed when it could not start or stopped on an error.

Between processes they travel in lists: whatever queued up while the sender waited for the
GIL goes in one send (each send costs the sending thread a few trips through the GIL, and a
trip can take the interpreter's whole switch interval when the other thread is busy).
"""
from __future__ import annotations

from dataclasses import dataclass

from autoglm_serve.engine.core.engine_core import CoreOutput
from autoglm_serve.engine.stats import CoreStats, EngineInfo
from autoglm_serve.engine.core.request import Request


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


def merge_outputs(messages: list) -> list:
    """Consecutive CoreOutputs as one (the latest stats); other messages kept in order."""
    merged: list = []
    for msg in messages:
        if isinstance(msg, CoreOutputs) and merged and isinstance(merged[-1], CoreOutputs):
            merged[-1] = CoreOutputs(merged[-1].outputs + msg.outputs, msg.stats)
        else:
            merged.append(msg)
    return merged

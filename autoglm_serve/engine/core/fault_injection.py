"""Faults on demand, for the tests (and GPU checks) of fault isolation, read once from the
environment of the process that runs the core:

    AUTOGLM_INJECT_FAULT="oom:TOKEN"      a step prefilling a prompt that holds token id TOKEN
                                          runs out of memory (torch.OutOfMemoryError)
    AUTOGLM_INJECT_FAULT="error:TOKEN"    ... raises a RuntimeError instead
    AUTOGLM_INJECT_FAULT="oom-above:N"    a step of more than N tokens runs out of memory

Several, comma-separated. Unset (always, in production), the runner never calls it.
"""
from __future__ import annotations

import os

import torch

ENV = "AUTOGLM_INJECT_FAULT"


class FaultInjector:
    def __init__(self, spec: str):
        self.oom_tokens: set[int] = set()
        self.error_tokens: set[int] = set()
        self.oom_above: int | None = None
        for item in filter(None, (p.strip() for p in spec.split(","))):
            kind, _, value = item.partition(":")
            if kind == "oom":
                self.oom_tokens.add(int(value))
            elif kind == "error":
                self.error_tokens.add(int(value))
            elif kind == "oom-above":
                self.oom_above = int(value)
            else:
                raise ValueError(f"{ENV}: unknown fault {item!r}")

    @classmethod
    def from_env(cls) -> FaultInjector | None:
        spec = os.environ.get(ENV)
        return cls(spec) if spec else None

    def check(self, scheduled) -> None:
        """Raises the fault this step is set to meet, before the model runs."""
        if self.oom_above is not None and sum(s.num_new_tokens for s in scheduled) > self.oom_above:
            raise torch.OutOfMemoryError(f"injected: a step of more than {self.oom_above} tokens")
        for s in scheduled:
            req = s.request
            if req.num_computed_tokens >= req.num_prompt_tokens:
                continue
            prompt = set(req.prompt_token_ids)
            if prompt & self.oom_tokens:
                raise torch.OutOfMemoryError(f"injected: out of memory for {req.request_id}")
            if prompt & self.error_tokens:
                raise RuntimeError(f"injected: an error for {req.request_id}")

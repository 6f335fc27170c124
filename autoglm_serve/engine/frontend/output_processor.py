"""Engine-core token outputs → RequestOutputs: detokenization, stop strings, logprobs, n > 1."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from autoglm_serve.engine.core.engine_core import CoreOutput
from autoglm_serve.engine.frontend.detokenizer import IncrementalDetokenizer
from autoglm_serve.engine.core.request import Request
from autoglm_serve.outputs import (CompletionOutput, Logprob, RequestError, RequestMetrics,
                                   RequestOutput)


@dataclass
class _Child:
    index: int
    detok: IncrementalDetokenizer | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    sent_tokens: int = 0
    sent_logprobs: int = 0
    num_preemptions: int = 0


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: dict[str, _Child]
    delta: bool                       # streaming: each output carries only what is new
    final_only: bool                  # offline: one output, when the request finishes
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    num_unfinished: int = 0           # children without a finish reason, counted as they end
    error: RequestError | None = None  # the core failed one of its children: all of it fails
    prompt_logprobs: list | None = None  # asked for: None for the first prompt token, then...

    @property
    def finished(self) -> bool:
        return self.num_unfinished == 0

    def finish(self, child: _Child, reason: str, stop_reason: str | int | None) -> None:
        child.finish_reason, child.stop_reason = reason, stop_reason
        self.num_unfinished -= 1


class OutputProcessor:
    def __init__(self, tokenizer, keep_special_tokens=()):
        """keep_special_tokens: tokens that stay in the text even where the tokenizer marks them
        special (GLM's reasoning tags: the <think>/<answer> split and agents parse them)."""
        self.tokenizer = tokenizer
        special = set(tokenizer.all_special_tokens) if tokenizer is not None else set()
        self.keep_special_ids = frozenset(tokenizer.convert_tokens_to_ids(t)
                                          for t in keep_special_tokens if t in special)
        self.states: dict[str, RequestState] = {}
        self.children: dict[str, tuple[RequestState, _Child]] = {}   # by child request id

    def add(self, request_id: str, prompt: str | None, requests: list[Request],
            delta: bool = False, final_only: bool = False) -> RequestState:
        params = requests[0].sampling_params
        children = {}
        for i, req in enumerate(requests):
            detok = None
            if self.tokenizer is not None:
                detok = IncrementalDetokenizer(
                    self.tokenizer, req.prompt_token_ids, params.skip_special_tokens,
                    params.stop, params.include_stop_str_in_output, self.keep_special_ids)
            children[req.request_id] = _Child(i, detok, logprobs=[] if params.logprobs is not None
                                              else None,
                                              cumulative_logprob=0.0 if params.logprobs is not None
                                              else None)
        state = RequestState(request_id, prompt, requests[0].prompt_token_ids, children, delta,
                             final_only,
                             RequestMetrics(arrival_time=requests[0].arrival_time),
                             num_unfinished=len(children))
        self.states[request_id] = state
        for child_id, child in children.items():
            self.children[child_id] = (state, child)
        return state

    def process(self, outputs: list[CoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Returns the outputs to hand out and the child request ids the core must abort
        (their text hit a stop string)."""
        now = time.monotonic()
        touched: dict[str, RequestState] = {}
        to_abort: list[str] = []
        for out in outputs:
            entry = self.children.get(out.request_id)
            if entry is None:
                continue
            state, child = entry
            if child.finish_reason is not None:
                continue
            if out.error is not None:
                to_abort += self._fail(state, out.error, out.request_id)
                touched[state.request_id] = state
                continue
            metrics = state.metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            if out.num_cached_tokens is not None:    # a child's first output
                state.num_cached_tokens = max(state.num_cached_tokens, out.num_cached_tokens)
            if out.first_scheduled_time is not None and (
                    metrics.first_scheduled_time is None
                    or out.first_scheduled_time < metrics.first_scheduled_time):
                metrics.first_scheduled_time = out.first_scheduled_time
            metrics.last_token_time = now
            child.num_preemptions = out.num_preemptions
            if out.prompt_logprobs is not None and state.prompt_logprobs is None:
                state.prompt_logprobs = [None] + [
                    self._logprob_entry(tid, lp)
                    for tid, lp in zip(state.prompt_token_ids[1:], out.prompt_logprobs)]
            child.token_ids.extend(out.new_token_ids)
            if out.logprobs is not None and child.logprobs is not None:
                for tid, lp in zip(out.new_token_ids, out.logprobs):
                    child.logprobs.append(self._logprob_entry(tid, lp))
                    child.cumulative_logprob += lp.sampled_logprob
            detok = child.detok
            if detok is not None:
                # as vLLM: the token that stopped the request stays out of the text (GLM-4.1V's
                # </answer> EOS is no special token, and Open-AutoGLM parses up to the ")")
                stopped = out.finish_reason == "stop" and not detok.include_stop
                detok.add_tokens(out.new_token_ids[:-1] if stopped else out.new_token_ids)
                if detok.stop_reason is not None:
                    state.finish(child, "stop", detok.stop_reason)
                    if out.finish_reason is None:   # the core still runs it: stop it there
                        to_abort.append(out.request_id)
            if child.finish_reason is None and out.finish_reason is not None:
                state.finish(child, out.finish_reason, out.stop_reason)
            touched[state.request_id] = state
        results = []
        for s in touched.values():
            finished = s.finished
            if finished:
                s.metrics.finished_time = now
                self._forget(s)
            if finished or not s.final_only:
                results.append(self._make_output(s, finished))
        return results, to_abort

    @staticmethod
    def _fail(state: RequestState, error: RequestError, failed_id: str) -> list[str]:
        """Ends every child of a request the core failed one child of; returns the others'
        ids, which the core still runs."""
        state.error = error
        running = []
        for child_id, child in state.children.items():
            if child.finish_reason is None:
                state.finish(child, "error", None)
                if child_id != failed_id:
                    running.append(child_id)
        return running

    def abort(self, request_id: str) -> list[str]:
        """Marks a request aborted; returns its child ids for the core."""
        state = self.states.get(request_id)
        if state is None:
            return []
        for child in state.children.values():
            if child.finish_reason is None:
                state.finish(child, "abort", None)
        self._forget(state)
        return list(state.children)

    def _forget(self, state: RequestState) -> None:
        self.states.pop(state.request_id, None)
        for cid in state.children:
            self.children.pop(cid, None)

    def _logprob_entry(self, token_id: int, lp) -> dict[int, Logprob]:
        decode = (lambda t: self.tokenizer.decode([t])) if self.tokenizer is not None \
            else (lambda t: None)
        entry = {token_id: Logprob(lp.sampled_logprob, lp.sampled_rank, decode(token_id))}
        for rank, (tid, value) in enumerate(lp.top, start=1):
            if tid not in entry:
                entry[tid] = Logprob(value, rank, decode(tid))
        return entry

    def _make_output(self, state: RequestState, finished: bool) -> RequestOutput:
        completions = []
        num_preemptions = 0
        for child in state.children.values():
            num_preemptions += child.num_preemptions
            child_finished = child.finish_reason is not None
            if state.delta:
                text = child.detok.new_text(child_finished) if child.detok else ""
                token_ids = child.token_ids[child.sent_tokens:]
                child.sent_tokens = len(child.token_ids)
                logprobs = None
                if child.logprobs is not None:
                    logprobs = child.logprobs[child.sent_logprobs:]
                    child.sent_logprobs = len(child.logprobs)
                if not (text or token_ids or child_finished):
                    continue
            else:
                text = child.detok.text if child.detok else ""
                token_ids = list(child.token_ids)
                logprobs = child.logprobs
            completions.append(CompletionOutput(child.index, text, token_ids, child.finish_reason,
                                                child.stop_reason, logprobs,
                                                child.cumulative_logprob))
        return RequestOutput(state.request_id, state.prompt, state.prompt_token_ids, completions,
                             finished, state.metrics, state.num_cached_tokens, num_preemptions,
                             error=state.error, prompt_logprobs=state.prompt_logprobs)

"""Concurrent multi-turn conversations, the shape of phone-agent traffic without the images:
a shared system prompt, a distinct task each, every turn resending the whole history.

Used to see where a cluster routes each turn (the ``x-autoglm-replica`` header) and what the
prefix cache gains, summed over the servers' Prometheus counters.
"""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

SYSTEM_PROMPT = ("You operate an Android phone for the user. Each turn you get the task and "
                 "the history of your actions; answer with the next action only, as "
                 "do(action=..., element=[x, y]) or finish(message=...). ") * 4
_WORDS = ("open settings wifi battery camera gallery message contact call music video map "
          "weather alarm clock browser search share photo note calendar mail shop").split()


@dataclass
class ConversationRun:
    replicas: list[list[str]] = field(default_factory=list)   # [conversation][turn]
    statuses: list[int] = field(default_factory=list)


def task_text(seed: int, words: int = 60) -> str:
    rng = random.Random(seed)
    return "Task: " + " ".join(rng.choice(_WORDS) for _ in range(words))


def run_conversations(base_url: str, model: str, conversations: int = 12, turns: int = 3,
                      seed: int = 0, max_tokens: int = 4, timeout: float = 300,
                      system_prompt: str = SYSTEM_PROMPT) -> ConversationRun:
    """All conversations at once, each turn after the previous one's answer (no system
    message when ``system_prompt`` is empty)."""
    run = ConversationRun(replicas=[[] for _ in range(conversations)])

    def one(index: int) -> None:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": task_text(seed * 1000 + index)})
        with httpx.Client(timeout=timeout, trust_env=False) as http:
            for turn in range(turns):
                r = http.post(f"{base_url}/v1/chat/completions", json={
                    "model": model, "messages": messages, "max_tokens": max_tokens,
                    "temperature": 0})
                run.statuses.append(r.status_code)
                run.replicas[index].append(r.headers.get("x-autoglm-replica", ""))
                r.raise_for_status()
                messages = messages + [
                    {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                    {"role": "user", "content": f"Screen {turn + 1}: the app is open."}]

    with ThreadPoolExecutor(conversations) as pool:
        list(pool.map(one, range(conversations)))
    return run


def prefix_counters(metrics_text: str) -> tuple[float, float]:
    """(hits, queries) of the prefix cache, in tokens, summed over every series."""
    hits = queries = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("vllm:prefix_cache_hits"):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_queries"):
            queries += float(line.rsplit(" ", 1)[1])
    return hits, queries

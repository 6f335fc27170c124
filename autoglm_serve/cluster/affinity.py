"""Prefix keys of a request: the hashes a conversation's later turns share with its earlier ones.

A chat request gives one key per message prefix after the system prompt(s): the next turn of
the same conversation repeats those messages, so its longest known key names the replica that
computed them. System prompts alone give no key, so conversations that only share a system
prompt are spread by load instead of piling onto one replica. Only the text of a message
counts: agents drop old screenshots from the history, and the turn must still match. A text
prompt (/v1/completions) gives one key per full 256-character chunk, like KV blocks.
"""
from __future__ import annotations

import hashlib
import json

PROMPT_CHUNK_CHARS = 256
_MAX_KEYS = 64   # the longest prefixes matter most; a 500-message history needs no 500 hashes


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):   # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def chat_prefix_keys(messages: list) -> list[str]:
    """Keys of messages[:i+1] for each i past the leading system messages, shortest first."""
    digest = hashlib.blake2b(digest_size=12)
    keys = []
    leading_system = True
    for message in messages:
        if not isinstance(message, dict):
            return keys
        role = str(message.get("role", ""))
        digest.update(json.dumps([role, _text(message.get("content"))]).encode())
        if leading_system and role in ("system", "developer"):
            continue
        leading_system = False
        keys.append(digest.copy().hexdigest())
    return keys[-_MAX_KEYS:]


def prompt_prefix_keys(prompt: str) -> list[str]:
    digest = hashlib.blake2b(digest_size=12)
    keys = []
    for start in range(0, len(prompt) - PROMPT_CHUNK_CHARS + 1, PROMPT_CHUNK_CHARS):
        digest.update(prompt[start:start + PROMPT_CHUNK_CHARS].encode())
        keys.append(digest.copy().hexdigest())
    return keys[-_MAX_KEYS:]


def request_prefix_keys(path: str, body: bytes) -> list[str]:
    """Keys of an HTTP request to the OpenAI routes; none for anything else or bad JSON (the
    replica answers that with its own error)."""
    if not path.endswith(("/chat/completions", "/completions")):
        return []
    try:
        payload = json.loads(body)
    except ValueError:
        return []
    if not isinstance(payload, dict):
        return []
    if isinstance(payload.get("messages"), list):
        return chat_prefix_keys(payload["messages"])
    if isinstance(payload.get("prompt"), str):
        return prompt_prefix_keys(payload["prompt"])
    return []

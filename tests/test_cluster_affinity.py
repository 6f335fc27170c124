"""The prefix keys the cluster's router matches conversations by (cluster/affinity.py)."""
from __future__ import annotations

import json

from autoglm_serve.cluster.affinity import (PROMPT_CHUNK_CHARS, chat_prefix_keys,
                                            prompt_prefix_keys, request_prefix_keys)

SYSTEM = {"role": "system", "content": "You operate a phone."}


def _image_turn(text: str, with_image: bool) -> dict:
    parts = [{"type": "text", "text": text}]
    if with_image:
        parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
    return {"role": "user", "content": parts}


def test_next_turn_contains_every_key_of_the_previous_one():
    turn1 = [SYSTEM, _image_turn("open settings", with_image=True)]
    # agents drop the old screenshot and add the answer and a new screen
    turn2 = [SYSTEM, _image_turn("open settings", with_image=False),
             {"role": "assistant", "content": "do(action='Tap')"},
             _image_turn("screen 2", with_image=True)]
    k1, k2 = chat_prefix_keys(turn1), chat_prefix_keys(turn2)
    assert len(k1) == 1 and len(k2) == 3
    assert k2[0] == k1[0]


def test_system_prompt_alone_gives_no_key_and_tasks_differ():
    assert chat_prefix_keys([SYSTEM]) == []
    a = chat_prefix_keys([SYSTEM, {"role": "user", "content": "task a"}])
    b = chat_prefix_keys([SYSTEM, {"role": "user", "content": "task b"}])
    other_system = chat_prefix_keys([{"role": "system", "content": "x"},
                                     {"role": "user", "content": "task a"}])
    assert a != b and a != other_system


def test_text_prompts_key_full_chunks_and_bad_bodies_give_none():
    prompt = "x" * (PROMPT_CHUNK_CHARS * 2 + 10)
    keys = prompt_prefix_keys(prompt)
    assert len(keys) == 2 and prompt_prefix_keys(prompt[:PROMPT_CHUNK_CHARS]) == keys[:1]
    body = json.dumps({"prompt": prompt}).encode()
    assert request_prefix_keys("/v1/completions", body) == keys
    assert request_prefix_keys("/v1/chat/completions", b"{not json") == []
    assert request_prefix_keys("/v1/chat/completions", b"[1, 2]") == []
    assert request_prefix_keys("/tokenize", body) == []

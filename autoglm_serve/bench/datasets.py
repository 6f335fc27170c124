"""Prompt sets for `bench serve` / `bench offline`: random, a JSONL file, or a ShareGPT JSON file.

The phone-agent workload is not a fixed list of prompts (each step depends on the model's reply)
and lives in phone_agent.py.
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

log = logging.getLogger(__name__)


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


@dataclass
class BenchRequest:
    """One prompt to send. Chat endpoints get `messages` (or the prompt as one user turn)."""

    prompt: str
    prompt_len: int  # tokens, by the tokenizer when there is one, else a word count
    output_len: int  # max tokens to generate
    messages: list[dict[str, Any]] | None = None
    prompt_token_ids: list[int] | None = None  # exact ids, used by the offline driver


def load_tokenizer(name_or_path: str | None) -> TokenizerLike | None:
    """The tokenizer asked for with --tokenizer: a local path, or a name already in the local
    hub cache. Never the network: a benchmark machine often has no hub, and transformers'
    retries there cost ~30 s before failing.

    Without one, lengths are counted in words and output tokens come from the server's usage.
    """
    if not name_or_path:
        return None
    try:
        from transformers import AutoTokenizer

        path = name_or_path
        if not os.path.isdir(path):
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name_or_path, "tokenizer_config.json")
            if not isinstance(cached, str):
                raise FileNotFoundError("not a local directory, nor in the local hub cache")
            path = os.path.dirname(cached)
        return AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    except Exception as exc:  # noqa: BLE001 - any failure means "no tokenizer", not an error
        log.warning("no tokenizer for %s (%s); counting words instead of tokens", name_or_path, exc)
        return None


def token_counter(tokenizer: TokenizerLike | None) -> Callable[[str], int]:
    if tokenizer is None:
        return lambda text: len(text.split())
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


# Used only without a tokenizer: ordinary words, so servers tokenise them into about one token each.
_FALLBACK_WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line"
).split()


def _lengths(rng: random.Random, mean: int, ratio: float, n: int) -> list[int]:
    """Integer lengths uniform in [mean*(1-ratio), mean*(1+ratio)], at least 1 (vLLM's rule)."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError("--range-ratio must be in [0, 1)")
    lo, hi = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def _special_ids(tokenizer: Any) -> set[int]:
    ids = getattr(tokenizer, "all_special_ids", None) or []
    return set(ids)


def random_dataset(
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    tokenizer: TokenizerLike | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """Prompts of random tokens with the given lengths (random words without a tokenizer)."""
    rng = random.Random(seed)
    in_lens = _lengths(rng, input_len, range_ratio, num_prompts)
    out_lens = _lengths(rng, output_len, range_ratio, num_prompts)
    requests = []
    if tokenizer is not None:
        vocab_size = len(tokenizer)  # type: ignore[arg-type]
        special = _special_ids(tokenizer)
        candidates = [i for i in range(vocab_size) if i not in special]
        for n_in, n_out in zip(in_lens, out_lens):
            ids = [rng.choice(candidates) for _ in range(n_in)]
            text = tokenizer.decode(ids)
            requests.append(BenchRequest(text, n_in, n_out, prompt_token_ids=ids))
    else:
        for n_in, n_out in zip(in_lens, out_lens):
            text = " ".join(rng.choice(_FALLBACK_WORDS) for _ in range(n_in))
            requests.append(BenchRequest(text, n_in, n_out))
    return requests


def _cycle_to(items: list[BenchRequest], n: int, rng: random.Random) -> list[BenchRequest]:
    if not items:
        raise ValueError("the dataset has no usable prompts")
    rng.shuffle(items)
    return [items[i % len(items)] for i in range(n)]


def jsonl_dataset(
    path: str | Path,
    num_prompts: int,
    output_len: int | None,
    tokenizer: TokenizerLike | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """One request per line: {"prompt": str} or {"messages": [...]}, optional "output_len".

    `output_len` (from --output-len) overrides the file's; the default is 128.
    """
    count = token_counter(tokenizer)
    items = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not JSON ({exc})") from exc
        messages = row.get("messages")
        if messages is not None:
            text = " ".join(_message_text(m) for m in messages)
        elif "prompt" in row:
            text = str(row["prompt"])
        else:
            raise ValueError(f"{path}:{lineno}: needs a 'prompt' or 'messages' field")
        n_out = output_len or int(row.get("output_len") or row.get("max_tokens") or 128)
        items.append(BenchRequest(text, count(text), n_out, messages=messages))
    return _cycle_to(items, num_prompts, random.Random(seed))


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return " ".join(p.get("text", "") for p in content if isinstance(p, dict))


def sharegpt_dataset(
    path: str | Path,
    num_prompts: int,
    output_len: int | None,
    tokenizer: TokenizerLike | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """First human turn as the prompt, the first reply's length as the output length.

    Filters as vLLM does: drop prompts or replies under 4 tokens, prompts over 1024 tokens and
    pairs over 2048 tokens (the length filters apply only when the reply length is used).
    """
    count = token_counter(tokenizer)
    data = json.loads(Path(path).read_text())
    items = []
    for conv in data:
        turns = conv.get("conversations") or conv.get("conversation") or []
        if len(turns) < 2:
            continue
        prompt, reply = str(turns[0].get("value", "")), str(turns[1].get("value", ""))
        n_in = count(prompt)
        n_out = output_len or count(reply)
        if n_in < 4 or n_out < 4:
            continue
        if output_len is None and (n_in > 1024 or n_in + n_out > 2048):
            continue
        items.append(BenchRequest(prompt, n_in, n_out))
    return _cycle_to(items, num_prompts, random.Random(seed))


def load_dataset(
    name: str,
    num_prompts: int,
    input_len: int,
    output_len: int | None,
    range_ratio: float = 0.0,
    tokenizer: TokenizerLike | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """`random`, a `.jsonl` file, or a ShareGPT `.json` file."""
    if name == "random":
        return random_dataset(
            num_prompts, input_len, output_len or 128, range_ratio, tokenizer, seed
        )
    path = Path(name)
    if not path.exists():
        raise ValueError(f"--dataset {name!r}: not 'random', 'phone-agent' or an existing file")
    if path.suffix == ".jsonl":
        return jsonl_dataset(path, num_prompts, output_len, tokenizer, seed)
    if path.suffix == ".json":
        return sharegpt_dataset(path, num_prompts, output_len, tokenizer, seed)
    raise ValueError(f"--dataset {name!r}: expected a .jsonl or a ShareGPT .json file")

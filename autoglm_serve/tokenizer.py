"""Load the tokenizer (with its chat template) from an HF checkpoint directory, a GGUF file or a
Hub id."""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import tokenizers
import transformers
from tokenizers import Regex, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.integrations.gguf.reader import read_gguf_metadata

from autoglm_serve.derived_cache import entry_path, publish
from autoglm_serve.loader.hub import hub_path

log = logging.getLogger(__name__)

# Any of these in a directory means AutoTokenizer can build a tokenizer from it.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(model_path: str | Path, tokenizer_path: str | Path | None = None,
                   download_dir: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of `tokenizer_path` if given, else of `model_path` (a resolved local path).
    A `tokenizer_path` that is no local path but a Hub id (vLLM's `--tokenizer owner/name`,
    e.g. for a GGUF model) is found in or fetched into the Hugging Face cache, files only."""
    fetched = hub_path(str(tokenizer_path), cache_dir=download_dir, weights=False) \
        if tokenizer_path is not None else None
    path = fetched or Path(tokenizer_path if tokenizer_path is not None else model_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf_tokenizer(path)
    if path.is_dir():
        if any((path / name).is_file() for name in _TOKENIZER_FILES):
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
        raise ValueError(f"no tokenizer files in {str(path)!r} (looked for {', '.join(_TOKENIZER_FILES)})")
    if path.exists():
        raise ValueError(f"cannot load a tokenizer from {str(path)!r}: expected a .gguf file or a directory")
    raise FileNotFoundError(f"tokenizer path {str(path)!r} does not exist")


# llama.cpp's GLM-4 pre-tokenizer ("glm4", older files "chatglm-bpe"): GLM-4's tokenizer.json split,
# which transformers' GGUF tokenizer does not know (it would split like GPT-2).
_GLM4_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GLM4_PRE_TOKENIZERS = ("glm4", "chatglm-bpe")


# What a cached conversion depends on besides the file: this module's code and the libraries'.
_CONVERSION_SALT = "|".join((hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
                             transformers.__version__, tokenizers.__version__))


def _load_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The GGUF's tokenizer, converted once and then loaded from the derived cache: conversion
    parses the whole vocabulary (SmolLM2: 8.5 s on a busy 2-core machine, every start)."""
    entry = entry_path("gguf-tokenizer", [path], _CONVERSION_SALT)
    if (entry / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(entry, local_files_only=True)
        except (OSError, ValueError) as exc:
            log.warning("cached tokenizer %s unreadable (%s): converting %s again", entry, exc, path)
    start = time.perf_counter()
    tokenizer = _convert_gguf_tokenizer(path)
    seconds = time.perf_counter() - start
    if publish(entry, tokenizer.save_pretrained):
        log.info("tokenizer converted from %s in %.1f s; kept in %s", path.name, seconds, entry)
    return tokenizer


def _convert_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    # the scalar keys only: parsing the vocabulary arrays too takes seconds
    metadata, _ = read_gguf_metadata(path)
    if metadata.get("general.architecture") == "glm4":
        # AutoTokenizer refuses an architecture transformers cannot load as a model; the
        # tokenizer itself is plain byte-level BPE, which the fast tokenizer builds from the file.
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    if metadata.get("tokenizer.ggml.pre") in _GLM4_PRE_TOKENIZERS:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_GLM4_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if tokenizer.chat_template is None:
        # transformers copies tokenizer.chat_template today; keep serving chat if a version stops doing so.
        tokenizer.chat_template = metadata.get("tokenizer.chat_template")
    return tokenizer

"""Load the tokenizer (with its chat template) from an HF checkpoint directory or a GGUF file."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

# Any of these in a directory means AutoTokenizer can build a tokenizer from it.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(model_path: str | Path, tokenizer_path: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of `tokenizer_path` if given, else of `model_path`; local files only."""
    path = Path(tokenizer_path if tokenizer_path is not None else model_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf_tokenizer(path)
    if path.is_dir():
        if any((path / name).is_file() for name in _TOKENIZER_FILES):
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
        raise ValueError(f"no tokenizer files in {str(path)!r} (looked for {', '.join(_TOKENIZER_FILES)})")
    if path.exists():
        raise ValueError(f"cannot load a tokenizer from {str(path)!r}: expected a .gguf file or a directory")
    raise FileNotFoundError(f"tokenizer path {str(path)!r} does not exist")


def _load_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    if tokenizer.chat_template is None:
        # transformers copies tokenizer.chat_template today; keep serving chat if a version stops doing so.
        from autoglm_serve.loader.gguf_loader import gguf_metadata, open_gguf

        tokenizer.chat_template = gguf_metadata(open_gguf(path), "tokenizer.chat_template")
    return tokenizer

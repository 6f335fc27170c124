"""resolve_model_path and load_tokenizer on local directories, clear errors (Hub ids:
test_hub_model.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from autoglm_serve.loader import default_model_path, iter_model_weights, resolve_model_path
from autoglm_serve.tokenizer import load_tokenizer
from tests.tiny_llama import CHAT_TEMPLATE, build_tiny_llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def test_safetensors_directory(tiny_dir: Path) -> None:
    resolved = resolve_model_path(str(tiny_dir))
    assert (resolved.path, resolved.format) == (tiny_dir, "safetensors")
    assert resolved.config.model_type == "llama" and resolved.config.num_hidden_layers == 2
    weights = dict(iter_model_weights(resolved))
    assert "lm_head.weight" in weights and weights["lm_head.weight"].dtype == torch.float32


def test_config_only_directory(tmp_path: Path, tiny_dir: Path) -> None:
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    resolved = resolve_model_path(tmp_path)
    assert resolved.format == "dir-config-only"
    with pytest.raises(ValueError, match="dummy weights"):
        iter_model_weights(resolved)


def test_directory_with_one_gguf(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").symlink_to(default_model_path())
    resolved = resolve_model_path(tmp_path)
    assert (resolved.path, resolved.format) == (tmp_path / "model.gguf", "gguf")


def test_unknown_paths_are_not_looked_up(tmp_path: Path) -> None:
    # spelled as a path, not as a Hub id: never looked up there
    with pytest.raises(FileNotFoundError, match="unknown model path 'zai-org/AutoGLM-Phone-9B'"):
        resolve_model_path("./zai-org/AutoGLM-Phone-9B/")
    (tmp_path / "weights.txt").write_text("x")
    with pytest.raises(ValueError, match="unknown model path .*weights.txt"):
        resolve_model_path(tmp_path / "weights.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        resolve_model_path(tmp_path / "empty")


def test_bad_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    with pytest.raises(ValueError, match="cannot load model config"):
        resolve_model_path(tmp_path)


def test_tokenizer_from_directory(tiny_dir: Path, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_dir)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.decode(tokenizer.encode("open the camera app", add_special_tokens=False)) == "open the camera app"
    # tokenizer_path overrides model_path (e.g. a GGUF or config-only model with tokenizer elsewhere).
    assert load_tokenizer(tmp_path, tokenizer_path=tiny_dir).get_vocab() == tokenizer.get_vocab()


def test_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no tokenizer files"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")

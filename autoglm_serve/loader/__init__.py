"""Checkpoint loading: every format yields (hf_name, tensor) pairs in Hugging Face names."""

from autoglm_serve.loader.default_model import DEFAULT_MODEL_NAME, default_model_path
from autoglm_serve.loader.dummy import initialize_dummy_weights
from autoglm_serve.loader.gguf_loader import iter_gguf_weights, open_gguf, read_gguf_config
from autoglm_serve.loader.model_path import ResolvedModel, iter_model_weights, resolve_model_path
from autoglm_serve.loader.safetensors_loader import iter_safetensors_weights, safetensors_files

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ResolvedModel",
    "default_model_path",
    "initialize_dummy_weights",
    "iter_gguf_weights",
    "iter_model_weights",
    "iter_safetensors_weights",
    "open_gguf",
    "read_gguf_config",
    "resolve_model_path",
    "safetensors_files",
]

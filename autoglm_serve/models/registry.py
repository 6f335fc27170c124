"""Model classes by the ``architectures`` entry of a checkpoint's config."""
from __future__ import annotations

import importlib

_MODELS = {
    "LlamaForCausalLM": ("autoglm_serve.models.llama", "LlamaForCausalLM"),
    "Glm4ForCausalLM": ("autoglm_serve.models.glm4", "Glm4ForCausalLM"),
    "Glm4vForConditionalGeneration": ("autoglm_serve.models.glm4v", "Glm4vForConditionalGeneration"),
}


# configs that name no architecture (GGUF metadata) are matched by model type
_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "glm4": "Glm4ForCausalLM",
                  "glm4v": "Glm4vForConditionalGeneration"}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def resolve_model_class(config):
    archs = list(getattr(config, "architectures", None) or [])
    if not archs and getattr(config, "model_type", None) in _BY_MODEL_TYPE:
        archs = [_BY_MODEL_TYPE[config.model_type]]
    for arch in archs:
        if arch in _MODELS:
            module, name = _MODELS[arch]
            return getattr(importlib.import_module(module), name)
    raise ValueError(f"model architecture {archs or '(none given)'} is not supported; "
                     f"supported: {', '.join(supported_architectures())}")

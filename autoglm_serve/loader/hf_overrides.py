"""`--hf-overrides` (vLLM's flag): a JSON object applied to the model's Hugging Face config
before anything is built from it. A key naming a sub-config (GLM-4.1V's ``text_config``,
``vision_config``) with an object as its value updates that sub-config's keys; any other key is
set as given, replacing what was there, new keys included (``quantization_config`` on a config
without one turns random weights into a quantized model of the real shapes:
``--load-format dummy --hf-overrides '{"quantization_config": {...}}'``)."""
from __future__ import annotations

import logging

from transformers import PretrainedConfig

logger = logging.getLogger(__name__)


def apply_hf_overrides(config: PretrainedConfig, overrides: dict, where: str = "") -> None:
    """Updates ``config`` in place (``where``: the sub-config's path, for the log)."""
    for key, value in overrides.items():
        current = getattr(config, key, None)
        if isinstance(current, PretrainedConfig) and isinstance(value, dict):
            apply_hf_overrides(current, value, f"{where}{key}.")
            continue
        logger.info("hf_overrides: %s%s = %r%s", where, key, value,
                    "" if hasattr(config, key) else " (new)")
        setattr(config, key, value)

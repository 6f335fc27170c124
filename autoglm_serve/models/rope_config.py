"""Reads rotary settings from a Hugging Face config (transformers 5 keeps them in rope_parameters)."""
from __future__ import annotations


def rope_parameters(config) -> dict:
    params = dict(getattr(config, "rope_parameters", None) or {})
    legacy = getattr(config, "rope_scaling", None) or {}
    params = {**legacy, **params}
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    if "partial_rotary_factor" not in params and hasattr(config, "partial_rotary_factor"):
        params["partial_rotary_factor"] = config.partial_rotary_factor
    return params


def check_default_rope(config) -> dict:
    params = rope_parameters(config)
    if params["rope_type"] not in ("default", "mrope"):
        raise ValueError(f"rope type {params['rope_type']!r} is not supported yet")
    return params

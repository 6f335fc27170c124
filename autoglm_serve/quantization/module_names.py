"""One module, many spellings: checkpoints and quantization tools name GLM-4.1V's modules
``model.language_model.layers.0...`` or ``model.layers.0...`` or ``language_model.model...``, and
its vision tower ``model.visual.*`` or ``visual.*``. Ignore lists and per-module overrides are
matched against every spelling, so a list written for one layout never silently misses the
other (a missed vision entry would otherwise mean "quantize the vision tower")."""
from __future__ import annotations

import re

_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
VISION_ROOT = "visual."


def base_name(name: str) -> str:
    """The name without its layout prefix: ``layers.0.mlp.down_proj``, ``visual.blocks.0...``."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def spellings(name: str) -> list[str]:
    base = base_name(name)
    return [base] + [prefix + base for prefix in _PREFIXES]


def is_vision(name: str) -> bool:
    return base_name(name).startswith(VISION_ROOT) or base_name(name) == "visual"


def matches_any(entries, module_name: str) -> bool:
    """Whether an ignore/target entry names this module: ``re:`` patterns (re.match, as
    compressed-tensors does) against any spelling, else the module or one of its parents."""
    names = spellings(module_name)
    base = names[0]
    for entry in entries:
        if entry.startswith("re:"):
            if any(re.match(entry[3:], n) for n in names):
                return True
            continue
        other = base_name(entry)
        if base == other or base.startswith(other + "."):
            return True
    return False

"""The `quantize --method` names, apart from what each one writes (schemes.py): the command line
offers them without importing torch and compressed-tensors."""
from __future__ import annotations

from typing import Literal

Method = Literal["rtn", "gptq", "awq", "fp8"]
METHODS: tuple[Method, ...] = ("rtn", "gptq", "awq", "fp8")
CALIBRATED_METHODS: tuple[Method, ...] = ("gptq", "awq")

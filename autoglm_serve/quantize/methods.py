"""The `quantize --method` names and defaults, apart from what each one writes (schemes.py): the
command line offers them without importing torch and compressed-tensors."""
from __future__ import annotations

from typing import Literal

Method = Literal["rtn", "gptq", "awq", "fp8", "gptq-fp8"]
METHODS: tuple[Method, ...] = ("rtn", "gptq", "awq", "fp8", "gptq-fp8")
CALIBRATED_METHODS: tuple[Method, ...] = ("gptq", "awq", "gptq-fp8")
# the methods that write FP8 weights (per output channel) and per-token FP8 activations; the
# others write int4 weights in groups
FP8_METHODS: tuple[Method, ...] = ("fp8", "gptq-fp8")
GPTQ_METHODS: tuple[Method, ...] = ("gptq", "gptq-fp8")

# calibration samples (calibration.py). SmolLM2, GPTQ group 32 with zero points, perplexity on
# prose, 2 threads: 32 samples +5.0%, 48 +2.6%, 64 +3.4% (each size is another set of texts)
DEFAULT_NUM_SAMPLES = 48

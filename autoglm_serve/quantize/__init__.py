"""`autoglm-serve quantize`: make compressed-tensors W4A16 (rtn, gptq) and FP8 checkpoints."""
from autoglm_serve.quantize.pipeline import write_quantized_checkpoint

__all__ = ["write_quantized_checkpoint"]

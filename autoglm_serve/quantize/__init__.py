"""`autoglm-serve quantize`: make compressed-tensors W4A16 (rtn, gptq, awq) and FP8 checkpoints
(pipeline.write_quantized_checkpoint). Nothing is imported here: the command line reads
methods.py without torch."""

"""CPU kernels in C, compiled on the machine that runs them (gguf_block_gemm.py)."""

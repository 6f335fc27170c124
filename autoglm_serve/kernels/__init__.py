

def fused_ops_enabled() -> bool:
    """Whether the fused Triton elementwise kernels may run (CUDA only; see fused_ops.py)."""
    try:
        from autoglm_serve.kernels import fused_ops
    except ImportError:   # no triton
        return False
    return fused_ops.ENABLED

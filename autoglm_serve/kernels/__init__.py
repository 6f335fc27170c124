"""Triton kernels, and the one switch between them and the PyTorch ops they replace."""


def fused_ops_enabled() -> bool:
    """Whether the fused Triton elementwise kernels may run (CUDA only; see fused_ops.py)."""
    try:
        from autoglm_serve.kernels import fused_ops
    except ImportError:   # no triton
        return False
    return fused_ops.ENABLED


def fused_kernels_on(x) -> bool:
    """Whether a layer runs its fused Triton kernel on ``x`` instead of PyTorch: ``x`` on CUDA,
    Triton importable and the start-up self-check passed (engine/core/kernel_checks.py)."""
    return x.is_cuda and fused_ops_enabled()


def fused_ops_for(x):
    """kernels/fused_ops.py where its kernels run on ``x`` (``fused_kernels_on``), else None."""
    if not fused_kernels_on(x):
        return None
    from autoglm_serve.kernels import fused_ops
    return fused_ops

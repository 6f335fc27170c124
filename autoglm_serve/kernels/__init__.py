"""Triton kernels, and the one switch between them and the PyTorch ops they replace."""


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (n >= 1), for launch parameters: ``triton.next_power_of_2``
    is a ConstexprFunction since Triton 3.6, ~2.8 us a host call against ~0.1 here, and an
    eager FP8 linear made several (config lookups, tile sizes)."""
    return 1 << max(0, (n - 1).bit_length())


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

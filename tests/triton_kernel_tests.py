"""What the Triton kernel tests share: they run on the GPU, else in Triton's interpreter
(tests/conftest.py switches it on without a GPU; its ``triton_interpreter_fixes`` fixture patches
the interpreter's bugs), and compare outputs by relative error."""
import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def require_gpu_or_interpreter() -> None:
    """Skips the calling test module where its kernels can neither compile nor be interpreted."""
    import triton
    if DEVICE == "cpu" and not triton.knobs.runtime.interpret:
        pytest.skip("no GPU and triton not in interpreter mode", allow_module_level=True)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()

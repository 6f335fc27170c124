"""Work-arounds for four bugs of the Triton 3.6 interpreter (not of our kernels), for tests that
run kernels on CPU under TRITON_INTERPRET=1:

1. it keeps bf16 as raw uint16 and tl.dot multiplies those integers; the operands are widened to
   fp32 first (exact: the GPU's bf16 MMA also accumulates exact products in fp32);
2. range() over tensor bounds calls int() on a 1-element array, an error since numpy 2.4;
3. fp32 -> bf16 casts truncate, where the GPU (and PyTorch) round to nearest even; a kernel that
   rounds intermediate values (the gated GEMV) then drifts by up to an ulp per rounding; casts
   to fp8 e4m3 (an fp8 KV cache) go wrong by more than that (1.94 -> 1.0), so they round
   through PyTorch too;
4. tl.fma multiplies and adds with two roundings where the GPU's FMA rounds once: an exact
   remainder (fp8_gemv's division) comes out wrong; fp32 operands are fused in float64 (their
   product is exact there).
"""
from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
import triton.runtime.interpreter as interpreter

_create_dot = interpreter.InterpreterBuilder.create_dot
_cast_impl = interpreter.InterpreterBuilder.cast_impl
_create_fp_to_fp = interpreter.InterpreterBuilder.create_fp_to_fp
_patch_lang_tensor = interpreter._patch_lang_tensor
_create_fma = interpreter.InterpreterBuilder.create_fma


def _dot_bf16_as_fp32(self, a, b, d, input_precision, max_num_imprecise_acc):
    def widen(x):
        if x.dtype.scalar == tl.bfloat16:
            data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None)
            return interpreter.TensorHandle(data.view(np.float32), tl.float32)
        return x
    return _create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)


def _fp_to_fp_rounding_to_fp8(self, src, dst_type, rounding_mode):
    if dst_type.scalar == tl.float8e4nv and src.dtype.scalar in (tl.float32, tl.bfloat16):
        data = src.data
        if src.dtype.scalar == tl.bfloat16:
            data = interpreter._convert_float(data, tl.bfloat16, tl.float32, None).view(np.float32)
        # saturating, as the GPU's cvt.satfinite
        values = torch.from_numpy(np.ascontiguousarray(data)).clamp(-448.0, 448.0)
        rounded = values.to(torch.float8_e4m3fn)
        return interpreter.TensorHandle(rounded.view(torch.uint8).numpy(), tl.float8e4nv)
    return _create_fp_to_fp(self, src, dst_type, rounding_mode)


def _cast_rounding_to_bf16(self, src, dst_type):
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
        return interpreter.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16),
                                        tl.bfloat16)
    return _cast_impl(self, src, dst_type)


def _fused_fma(self, x, y, z):
    if x.dtype.scalar == y.dtype.scalar == z.dtype.scalar == tl.float32:
        wide = x.data.astype(np.float64) * y.data.astype(np.float64) + z.data.astype(np.float64)
        return interpreter.TensorHandle(wide.astype(np.float32), tl.float32)
    return _create_fma(self, x, y, z)


def _patch_tensor(tensor, scope):
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


def fix_interpreter(monkeypatch) -> None:
    """Applies the work-arounds for one test (pass pytest's ``monkeypatch``)."""
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", _dot_bf16_as_fp32)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "cast_impl", _cast_rounding_to_bf16)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fp_to_fp",
                        _fp_to_fp_rounding_to_fp8)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fma", _fused_fma)
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", _patch_tensor)

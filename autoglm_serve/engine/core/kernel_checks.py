"""Start-up self-check of the fused elementwise kernels (kernels/fused_ops.py) against the
PyTorch layers they replace (models/layers).

It lives above both: the layers pick the kernels, so the kernels must not import the layers
back for their references (that was an import cycle between ``kernels`` and ``models``).
"""
from __future__ import annotations

import logging

import torch

from autoglm_serve.kernels import fused_ops, kv_write
from autoglm_serve.models.layers import norm as norm_layers
from autoglm_serve.models.layers.activation import SiluAndMul
from autoglm_serve.models.layers.rotary import RotaryEmbedding
from autoglm_serve.models.layers.torch_attention import write_kv_cache

logger = logging.getLogger(__name__)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-6)) < 2e-2)


def check_fused_ops(device: torch.device, dtype: torch.dtype) -> bool:
    """Runs every fused kernel once against PyTorch on random data at AutoGLM-Phone-9B's shapes
    (the rotary + KV-cache write of kernels/kv_write.py included); on any problem sets
    ``fused_ops.ENABLED = False``, so the layers run their PyTorch ops. Returns ``ENABLED``."""
    was = fused_ops.ENABLED
    try:
        fused_ops.ENABLED = False       # the layers' own forward is the reference
        x = torch.randn(7, 4096, device=device, dtype=dtype)
        r = torch.randn_like(x)
        norm = norm_layers.RMSNorm(4096, 1e-5, dtype).to(device)
        norm.weight.data.uniform_(0.5, 1.5)
        first_norm = norm_layers.RMSNorm(4096, 1e-5, dtype).to(device)
        first_norm.weight.data.uniform_(0.5, 1.5)
        ref_out, ref_res = norm(x, r)
        ref_plain = norm(x)
        ref_pair_out, ref_pair_res, _ = norm_layers.rms_norm_pair(first_norm, norm, x, r)
        g = torch.randn(7, 2 * 1000, device=device, dtype=dtype)
        ref_silu = SiluAndMul()(g)
        rot = RotaryEmbedding(128, 64, 4096, 10000.0, interleaved=True).to(device)
        pos = torch.randint(0, 4096, (7,), device=device)
        q = torch.randn(7, 32 * 128, device=device, dtype=dtype)
        kq = torch.randn(7, 2 * 128, device=device, dtype=dtype)
        v = torch.randn(7, 2, 128, device=device, dtype=dtype)
        ref_q, ref_k = rot(pos, q.clone(), kq.clone())
        cos, sin = rot.cos_sin(pos)
        slots = torch.tensor([0, 5, 17, -1, 33, 40, 63], device=device)
        cache = torch.zeros(2, 4, 2, 16, 128, device=device, dtype=dtype)
        ref_cache = cache.clone()
        write_kv_cache(ref_k.view(7, 2, 128), v, ref_cache, slots)

        out, res = fused_ops.rms_norm(x, norm.weight, 1e-5, r)
        ok = (_close(out, ref_out) and _close(res, ref_res)
              and _close(fused_ops.rms_norm(x, norm.weight, 1e-5), ref_plain))
        # the FP8 codes it writes too are checked with the FP8 quantization's kernels
        # (quantization/kernel_checks.check_fp8_quant)
        out, res, fp8_rows = fused_ops.rms_norm_pair(x, r, first_norm.weight, 1e-5,
                                                     norm.weight, 1e-5, fp8=True)
        ok = ok and _close(out, ref_pair_out) and _close(res, ref_pair_res)
        ok = ok and torch.equal(fp8_rows.amax, out.float().abs().amax(dim=-1))
        ok = ok and _close(fused_ops.silu_and_mul(g), ref_silu)
        ok = ok and _close(fused_ops.rotary_(q.clone(), cos, sin, 128, True), ref_q)
        ok = ok and _close(fused_ops.rotary_(kq.clone(), cos, sin, 128, True), ref_k)
        kv_write.rotate_and_write_kv_cache(q.view(7, 32, 128), kq.view(7, 2, 128), v, cache,
                                           slots, cos, sin, interleaved=True)
        ok = ok and _close(q, ref_q) and _close(cache, ref_cache)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # a compile or launch failure: run the PyTorch ops instead
        logger.warning("fused kernels disabled: %r", exc)
        ok = False
    fused_ops.ENABLED = was and ok
    if not ok:
        logger.warning("fused kernels disagree with PyTorch or failed: using PyTorch ops")
    return fused_ops.ENABLED

"""Checkpoint tensors of each format -> our layout (wna16.py, fp8.py), one tensor at a time as
they stream out of the checkpoint, before the model's loaders see them.

Facts each conversion relies on (from the formats' documentation and writers):
- compressed-tensors pack-quantized: ``weight_packed`` int32 [N, K*bits/32] is our layout
  already; ``weight_scale`` [N, K/group]; ``weight_zero_point`` is packed along N (dim 0) and
  signed; ``weight_g_idx`` [K]; ``weight_shape`` is redundant here. float-quantized FP8:
  ``weight`` e4m3 [N, K] and ``weight_scale`` [N, 1].
- AWQ GEMM: ``qweight`` int32 [K, N/8] packed along N in AWQ_ORDER, ``qzeros`` [K/group, N/8]
  likewise (zero points as stored, unsigned), ``scales`` [K/group, N].
- GPTQ: ``qweight`` int32 [K*bits/32, N] packed along K, ``qzeros`` [K/group, N*bits/32] packed
  along N (v1 stores zero - 1), ``scales`` [K/group, N], ``g_idx`` [K].
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from autoglm_serve.quantization.config import QuantConfig, WeightScheme
from autoglm_serve.quantization.module_names import base_name, is_vision
from autoglm_serve.quantization.packing import (AWQ_ORDER, pack_last_dim, unpack_first_dim,
                                                unpack_last_dim)

QUANTIZED_SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
                      "weight_g_idx", "qweight", "qzeros", "scales", "g_idx", "input_scale")


def convert_checkpoint_tensors(weights: Iterable[tuple[str, torch.Tensor]],
                               qconfig: QuantConfig) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        module, _, leaf = name.rpartition(".")
        if leaf in QUANTIZED_SUFFIXES or tensor.dtype == torch.float8_e4m3fn:
            if is_vision(module):
                raise ValueError(
                    f"the checkpoint quantizes the vision tower ({name!r}), which this engine "
                    "serves in 16 bits only: use a checkpoint whose ignore list keeps "
                    "'model.visual' unquantized")
            if base_name(module).startswith(("lm_head", "embed_tokens")):
                raise ValueError(f"the checkpoint quantizes {module!r} ({name!r}); the "
                                 "embeddings and lm_head are served in 16 bits only")
            scheme = qconfig.scheme_for(module)
            if scheme is None:
                raise ValueError(f"{name!r} is quantized in the checkpoint, but its "
                                 f"quantization_config leaves {module!r} unquantized")
            converted = _convert(qconfig, scheme, leaf, tensor)
            if converted is not None:
                yield f"{module}.{converted[0]}", converted[1]
            continue
        yield name, tensor


def _convert(qconfig: QuantConfig, scheme: WeightScheme, leaf: str, t: torch.Tensor):
    bits = scheme.bits
    if scheme.kind == "fp8":
        if leaf == "weight":
            return "weight", t
        if leaf == "weight_scale":
            return "weight_scale", t.to(torch.float32).reshape(-1)
        raise ValueError(f"FP8 checkpoint tensor {leaf!r} is not supported (static activation "
                         "scales are not; dynamic per-token activations are)")
    if qconfig.method == "compressed-tensors":
        if leaf == "weight_packed":
            return "qweight", t
        if leaf == "weight_scale":
            return "scales", t
        if leaf == "weight_zero_point":
            # stored as zero + 2**(bits-1), like the weights: unpacked, it is our zero point
            return "zeros", unpack_last_dim(t.t().contiguous(), bits).t().contiguous()
        if leaf == "weight_g_idx":
            return "g_idx", t.to(torch.int32)
        if leaf == "weight_shape":
            return None
    elif qconfig.method == "awq":
        if leaf == "qweight":
            return "qweight", pack_last_dim(unpack_last_dim(t, bits, AWQ_ORDER).t(), bits)
        if leaf == "qzeros":
            return "zeros", unpack_last_dim(t, bits, AWQ_ORDER).t().contiguous()
        if leaf == "scales":
            return "scales", t.t().contiguous()
    elif qconfig.method == "gptq":
        if leaf == "qweight":
            return "qweight", pack_last_dim(unpack_first_dim(t, bits).t(), bits)
        if leaf == "qzeros":
            zeros = unpack_last_dim(t, bits).t().to(torch.int16)
            if qconfig.gptq_v1_zeros:
                zeros = zeros + 1
            return "zeros", (zeros & ((1 << bits) - 1)).to(torch.uint8).contiguous()
        if leaf == "scales":
            return "scales", t.t().contiguous()
        if leaf == "g_idx":
            return ("g_idx", t.to(torch.int32)) if scheme.act_order else None
    raise ValueError(f"checkpoint tensor {leaf!r} is not part of the {qconfig.method} format")


"""Quantized checkpoints of tiny random models, for tests (not a test itself).

Each writer quantizes the decoder's linear weights round-to-nearest (vision tower, embeddings and
lm_head stay 16-bit, as the published checkpoints keep them), saves the checkpoint in one
format, and returns the dequantized weights so a test can build the reference model that
transformers runs: for compressed-tensors transformers loads the checkpoint itself; for AWQ and
GPTQ the reference is the original model with these dequantized weights.

The packers here are written from the formats' descriptions, bit by bit, independently of
autoglm_serve/quantization (which must unpack what they write).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                   "gate_up_proj")


def is_decoder_linear(name: str) -> bool:
    parts = name.split(".")
    return (name.endswith(".weight") and "visual" not in name and len(parts) >= 2
            and parts[-2] in DECODER_LINEARS)


def rtn(w: torch.Tensor, bits: int, group: int, symmetric: bool):
    """-> unsigned codes [N, K] (int64), scales [N, K/group] (float32), unsigned zeros
    [N, K/group], and the dequantized weight (float32), w ~= (q - zero) * scale."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    top = (1 << bits) - 1
    if symmetric:
        scale = g.abs().amax(-1) / ((1 << (bits - 1)) - 1)
        zero = torch.full_like(scale, 1 << (bits - 1))
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scale = (hi - lo) / top
        zero = torch.round(-lo / scale.clamp_min(1e-8)).clamp(0, top)
    scale = scale.clamp_min(1e-8)
    q = torch.clamp(torch.round(g / scale[..., None]) + zero[..., None], 0, top)
    deq = ((q - zero[..., None]) * scale[..., None]).reshape(n, k)
    return q.reshape(n, k).long(), scale, zero.long(), deq


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)   # nibble i of an AWQ word holds column AWQ_ORDER[i]


def _pack_words(codes: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """[R, C] unsigned codes -> [R, C*bits/32] int32: slot i of word w (bits i*bits...) holds
    column w*pf + order[i] (sequential without ``order``)."""
    pf = 32 // bits
    r, c = codes.shape
    out = torch.zeros(r, c // pf, dtype=torch.int64)
    for slot in range(pf):
        col = order[slot] if order else slot
        out |= codes[:, col::pf].to(torch.int64) << (slot * bits)
    return (out - ((out >> 31) & 1) * (1 << 32)).to(torch.int32)   # as a signed 32-bit word


def _save(path: Path, tensors: dict, quant_config: dict) -> None:
    for f in path.glob("model*.safetensors*"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = quant_config
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


def quantize_checkpoint(path: Path, fmt: str, bits: int = 4, group: int = 32,
                        symmetric: bool = True, act_order: bool = False,
                        ignore: list[str] | None = None,
                        bits_of: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """Rewrites the safetensors checkpoint in ``path`` as ``fmt`` (compressed-tensors, awq,
    gptq); returns {weight name: dequantized float32 weight} for the reference model.
    ``bits_of``: per projection name (``down_proj``) a bit width other than ``bits`` (GPTQ's
    ``dynamic`` int4/int8 mixes)."""
    path = Path(path)
    state = load_file(str(path / "model.safetensors"))
    ignore = ignore or []
    out, deq_weights = {}, {}
    for name, w in state.items():
        module = name[: -len(".weight")]
        if not is_decoder_linear(name) or any(i in module for i in ignore):
            out[name] = w
            continue
        n, k = w.shape
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(k)) if act_order else None
        wq = w if perm is None else w[:, perm]     # groups are taken in the permuted order
        nbits = (bits_of or {}).get(module.rsplit(".", 1)[-1], bits)
        q, scale, zero, deq = rtn(wq, nbits, group, symmetric)
        if perm is not None:   # back to the original column order
            inverse = torch.argsort(perm)
            q, deq = q[:, inverse], deq[:, inverse]
            g_idx = (torch.arange(k) // group)[inverse].to(torch.int32)
        else:
            g_idx = (torch.arange(k) // group).to(torch.int32)
        deq_weights[name] = deq
        sdt = w.dtype if w.dtype != torch.float32 else torch.float16
        if fmt == "compressed-tensors":
            from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
            offset = 1 << (nbits - 1)
            out[module + ".weight_packed"] = pack_to_int32((q - offset).to(torch.int8), nbits)
            out[module + ".weight_scale"] = scale.to(sdt)
            out[module + ".weight_shape"] = torch.tensor([n, k])
            if not symmetric:
                out[module + ".weight_zero_point"] = pack_to_int32(
                    (zero - offset).to(torch.int8), nbits, packed_dim=0)
            if act_order:
                out[module + ".weight_g_idx"] = g_idx
        elif fmt == "awq":
            # [K, N] codes packed along N in AWQ's interleaved order
            out[module + ".qweight"] = _pack_words(q.t().contiguous(), nbits, AWQ_ORDER)
            out[module + ".qzeros"] = _pack_words(zero.t().contiguous(), nbits, AWQ_ORDER)
            out[module + ".scales"] = scale.t().contiguous().to(sdt)
        elif fmt == "gptq":
            out[module + ".qweight"] = _pack_words(q, nbits).t().contiguous()   # along K
            out[module + ".qzeros"] = _pack_words((zero - 1).t().contiguous(), nbits)  # v1: -1
            out[module + ".scales"] = scale.t().contiguous().to(sdt)
            out[module + ".g_idx"] = g_idx
        else:
            raise ValueError(fmt)
        # the reference runs the weights the checkpoint's own scales give
        s = scale.to(sdt).float()
        gi = g_idx.long()
        deq_weights[name] = (q - zero[:, gi]) * s[:, gi]
    config = _config(fmt, bits, group, symmetric, act_order, ignore)
    if bits_of:
        config["dynamic"] = {f"+:.*{name}": {"bits": b} for name, b in bits_of.items()}
    _save(path, out, config)
    return deq_weights


def _config(fmt, bits, group, symmetric, act_order, ignore) -> dict:
    if fmt == "awq":
        return {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": ignore or None}
    if fmt == "gptq":
        return {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order,
                "sym": symmetric, "checkpoint_format": "gptq"}
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                                 QuantizationScheme)
    weights = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy="group",
                               group_size=group)
    cfg = QuantizationConfig(config_groups={"group_0": QuantizationScheme(
        targets=["Linear"], weights=weights)}, format="pack-quantized",
        quantization_status="compressed", ignore=["lm_head"] + ignore).model_dump(mode="json")
    if act_order:   # as compressed-tensors < 0.20 wrote it (0.20 refuses to build it)
        cfg["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    return cfg


def reference_model(hf_model, deq_weights: dict[str, torch.Tensor]):
    """The 16-bit model with its decoder linears replaced by the dequantized weights."""
    state = hf_model.state_dict()
    with torch.no_grad():
        for name, w in deq_weights.items():
            state[name].copy_(w.to(state[name].dtype))
    return hf_model


def fp8_checkpoint(path: Path) -> None:
    """Rewrites the checkpoint as compressed-tensors float-quantized FP8: e4m3 weights with a
    scale per output channel, activations quantized per token at run time (dynamic)."""
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                                 QuantizationScheme)
    path = Path(path)
    state = load_file(str(path / "model.safetensors"))
    out = {}
    for name, w in state.items():
        if not is_decoder_linear(name):
            out[name] = w
            continue
        module = name[: -len(".weight")]
        scale = w.float().abs().amax(1, keepdim=True) / torch.finfo(torch.float8_e4m3fn).max
        out[name] = (w.float() / scale).to(torch.float8_e4m3fn)
        out[module + ".weight_scale"] = scale.to(torch.bfloat16)
    cfg = QuantizationConfig(config_groups={"group_0": QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(num_bits=8, type="float", strategy="channel", symmetric=True),
        input_activations=QuantizationArgs(num_bits=8, type="float", strategy="token",
                                           symmetric=True, dynamic=True))},
        format="float-quantized", quantization_status="compressed", ignore=["lm_head"])
    _save(path, out, cfg.model_dump(mode="json"))

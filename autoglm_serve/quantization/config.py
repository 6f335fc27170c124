"""What a checkpoint is quantized with, read from its ``quantization_config`` (or asked for with
``--quantization``), down to one ``WeightScheme`` per linear layer.

Formats: compressed-tensors (pack-quantized int4/int8 with groups, symmetric or not, optional
activation order; float-quantized FP8 per-channel weights with dynamic per-token activations),
AWQ (GEMM layout, zero points) and GPTQ (v1/v2 zero points, act-order ``g_idx``, and GPTQModel's
``dynamic`` per-module overrides for int4/int8 mixes). ``fp8`` on an unquantized checkpoint
quantizes at load. compressed-tensors' own pydantic config validates its format.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

from autoglm_serve.quantization.module_names import matches_any

# --quantization values, vLLM's spellings included, -> our method names
METHODS = {"awq": "awq", "awq_marlin": "awq", "gptq": "gptq", "gptq_marlin": "gptq",
           "compressed-tensors": "compressed-tensors", "compressed_tensors": "compressed-tensors",
           "fp8": "fp8"}


@dataclass(frozen=True)
class WeightScheme:
    kind: str                       # "wna16" (int weights, 16-bit activations) | "fp8" (W8A8)
    bits: int = 4
    group_size: int | None = 128    # None: one group per output channel (all of K)
    has_zeros: bool = False         # asymmetric: a zero point per group
    act_order: bool = False         # a g_idx maps each input channel to its group

    def describe(self) -> str:
        if self.kind == "fp8":
            return "FP8 W8A8 (per-channel weight scales, dynamic per-token activations)"
        group = f"group {self.group_size}" if self.group_size else "per-channel"
        extra = (", zero points" if self.has_zeros else ", symmetric") + \
                (", act-order" if self.act_order else "")
        return f"W{self.bits}A16 ({group}{extra})"


@dataclass
class QuantConfig:
    method: str                      # awq | gptq | compressed-tensors | fp8
    default: WeightScheme | None     # the scheme of a linear layer nothing else names
    ignore: list[str] = field(default_factory=list)     # stay unquantized
    # (name or "re:" pattern, scheme or None = unquantized), first match wins, before default
    overrides: list[tuple[str, WeightScheme | None]] = field(default_factory=list)
    quantize_at_load: bool = False   # fp8 on a 16-bit checkpoint
    gptq_v1_zeros: bool = True       # GPTQ v1 stores zero - 1

    def scheme_for(self, module_name: str) -> WeightScheme | None:
        if matches_any(self.ignore, module_name):
            return None
        for pattern, scheme in self.overrides:
            if matches_any([pattern], module_name):
                return scheme
        return self.default

    def describe(self) -> str:
        """The start-up report's words: the default scheme, then each override's (an int4/int8
        mix names its 8-bit modules)."""
        how = "quantized at load" if self.quantize_at_load else "from the checkpoint"
        parts = [self.default.describe() if self.default else "none"]
        parts += [f"{scheme.describe() if scheme else 'unquantized'} for {pattern}"
                  for pattern, scheme in self.overrides]
        return f"{self.method}: {'; '.join(parts)} ({how})"


def resolve_quant_config(hf_config, quantization: str | None, dummy: bool) -> QuantConfig | None:
    """The checkpoint's quantization_config, checked against ``--quantization``; None: serve
    unquantized. ``dummy``: random weights, so a method with no checkpoint config is fine."""
    asked = None
    if quantization is not None:
        asked = METHODS.get(quantization.lower())
        if asked is None:
            raise ValueError(f"quantization={quantization!r} is not supported (supported: "
                             f"{', '.join(sorted(set(METHODS.values())))})")
    raw = getattr(hf_config, "quantization_config", None)
    if raw is not None and not isinstance(raw, dict):
        raw = raw.to_dict()
    if raw:
        found = METHODS.get(str(raw.get("quant_method", "")).lower())
        if found is None:
            raise ValueError(f"the checkpoint is quantized with "
                             f"{raw.get('quant_method')!r}, which is not supported (supported: "
                             f"awq, gptq, compressed-tensors)")
        if asked is not None and asked != found:
            raise ValueError(f"the checkpoint is quantized with {found} but "
                             f"quantization={quantization!r} was asked for")
        return _PARSERS[found](raw)
    if asked is None:
        return None
    if asked == "fp8":
        return QuantConfig("fp8", WeightScheme("fp8", bits=8, group_size=None),
                           quantize_at_load=True)
    if not dummy:
        raise ValueError(f"quantization={quantization!r} needs a checkpoint quantized with "
                         f"{asked} (this one has no quantization_config); use "
                         "quantization='fp8' to quantize at load, or load_format='dummy'")
    # random weights in the format's usual layout: int4, group 128
    return QuantConfig(asked, WeightScheme("wna16", 4, 128, has_zeros=asked != "compressed-tensors"))


def _group(size) -> int | None:
    return None if size in (None, -1, 0) else int(size)


def _parse_awq(raw: dict) -> QuantConfig:
    version = str(raw.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"AWQ version {version!r} is not supported (only the GEMM layout)")
    scheme = WeightScheme("wna16", int(raw.get("bits", raw.get("w_bit", 4))),
                          _group(raw.get("group_size", raw.get("q_group_size", 128))),
                          has_zeros=bool(raw.get("zero_point", True)))
    if scheme.bits != 4:
        raise ValueError(f"AWQ with {scheme.bits} bits is not supported (4)")
    if not scheme.has_zeros:
        raise ValueError("AWQ without zero points is not supported")
    return QuantConfig("awq", scheme, ignore=list(raw.get("modules_to_not_convert") or []))


def _parse_gptq(raw: dict) -> QuantConfig:
    # GPTQ checkpoints always carry qzeros (7 = zero 8 for symmetric ones in v1)
    def scheme(cfg: dict) -> WeightScheme:
        return WeightScheme("wna16", int(cfg.get("bits", 4)), _group(cfg.get("group_size", 128)),
                            has_zeros=True, act_order=bool(cfg.get("desc_act", False)))
    base = scheme(raw)
    overrides = []
    for key, value in (raw.get("dynamic") or {}).items():
        # GPTQModel: "+:regex" (or a bare regex) overrides, "-:regex" skips the module
        pattern = "re:" + key.split(":", 1)[1] if key[:2] in ("+:", "-:") else "re:" + key
        overrides.append((pattern, None if key.startswith("-:") else
                          scheme({**raw, **value})))
    fmt = str(raw.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"GPTQ checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
    return QuantConfig("gptq", base, ignore=list(raw.get("modules_to_not_convert") or []),
                       overrides=overrides, gptq_v1_zeros=fmt == "gptq")


def _parse_compressed_tensors(raw: dict) -> QuantConfig:
    from compressed_tensors.quantization import QuantizationConfig
    # actorder "group" (a weight_g_idx per layer) is in checkpoints written before
    # compressed-tensors 0.20, which no longer validates it: read it, then validate the rest
    grouped_order = set()
    raw = copy.deepcopy(raw)
    for name, group in (raw.get("config_groups") or {}).items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if weights and weights.get("actorder") == "group":
            weights["actorder"] = None
            grouped_order.add(name)
    cfg = QuantizationConfig.model_validate(raw)
    status = _value(cfg.quantization_status)
    if status != "compressed":
        raise ValueError(f"compressed-tensors checkpoint with quantization_status {status!r}: "
                         "only compressed checkpoints are supported")
    default, overrides = None, []
    for name, group in cfg.config_groups.items():
        fmt = str(getattr(group, "format", None) or cfg.format)
        scheme = _ct_scheme(name, group, fmt)
        if name in grouped_order:
            scheme = dataclasses.replace(scheme, act_order=True)
        for target in group.targets:
            if target in ("Linear", "re:.*Linear", "torch.nn.Linear"):
                default = scheme
            else:
                overrides.append((target, scheme))
    return QuantConfig("compressed-tensors", default, ignore=list(cfg.ignore or []),
                       overrides=overrides)


def _value(x):
    """compressed-tensors' enums, or their plain strings (its models store either)."""
    return getattr(x, "value", x)


def _ct_scheme(name: str, group, fmt: str) -> WeightScheme:
    w, a = group.weights, group.input_activations
    if w is None:
        raise ValueError(f"compressed-tensors group {name!r} has no weight quantization")
    wtype, strategy = _value(w.type), _value(w.strategy)
    if wtype == "float" and w.num_bits == 8:
        if fmt != "float-quantized" or strategy != "channel" or a is None or \
                _value(a.strategy) != "token" or not a.dynamic:
            raise ValueError(f"compressed-tensors group {name!r}: FP8 is supported with "
                             "per-channel weights and dynamic per-token activations "
                             f"(got format {fmt}, weights {strategy}, activations "
                             f"{None if a is None else _value(a.strategy)})")
        return WeightScheme("fp8", bits=8, group_size=None)
    if wtype == "int" and a is None:
        if fmt != "pack-quantized":
            raise ValueError(f"compressed-tensors group {name!r}: int weights are supported in "
                             f"the pack-quantized format, not {fmt!r}")
        if strategy not in ("group", "channel"):
            raise ValueError(f"compressed-tensors group {name!r}: strategy {strategy!r} "
                             "(supported: group, channel)")
        # actorder "weight" only changed calibration: nothing is stored for it
        return WeightScheme("wna16", int(w.num_bits),
                            int(w.group_size) if strategy == "group" else None,
                            has_zeros=not w.symmetric)
    raise ValueError(f"compressed-tensors group {name!r}: weights {wtype}{w.num_bits} with "
                     f"activations {a} is not supported (W4A16/W8A16 int, FP8 W8A8 dynamic)")


def _refuse_hf_fp8(raw: dict) -> QuantConfig:
    raise ValueError("quant_method 'fp8' checkpoints (block-wise FP8) are not supported; "
                     "compressed-tensors FP8 checkpoints are")


_PARSERS = {"awq": _parse_awq, "gptq": _parse_gptq,
            "compressed-tensors": _parse_compressed_tensors,
            "fp8": _refuse_hf_fp8}


def check_method_name(quantization: str | None) -> None:
    """Raises for a --quantization value we do not know (start-up check, before loading)."""
    if quantization is not None and quantization.lower() not in METHODS:
        raise ValueError(f"quantization={quantization!r} is not supported (supported: "
                         f"{', '.join(sorted(set(METHODS.values())))})")

"""What each `--method` writes: a compressed-tensors QuantizationConfig, and which modules it skips.

W4A16 (rtn, gptq, awq): symmetric int4 weights, one scale per `group_size` input channels,
16-bit activations; compressed-tensors stores it "pack-quantized" (8 int4 in an int32). Linears
named by --int8-targets get int8 weights in the same groups (W8A16, a second config group), as
llama.cpp's Q4_K_M keeps some of its tensors at 6 bits.
FP8 (fp8: rounded to nearest; gptq-fp8: by GPTQ): float8_e4m3 weights with one scale per output
channel and activations quantized per token at run time ("FP8_DYNAMIC"); stored
"float-quantized".
"""
from __future__ import annotations

import re

import torch
from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                             QuantizationScheme, QuantizationStatus,
                                             QuantizationStrategy, QuantizationType)

from autoglm_serve.quantize.methods import FP8_METHODS, Method

DEFAULT_GROUP_SIZE = 128

# GLM-4.1V's vision tower (and its merger/downsample) as transformers' Glm4vForConditionalGeneration
# names it: `model.visual.*`. vLLM's own module names drop the `model.` prefix (`visual.*`), so
# the ignore list carries both spellings: whichever a loader matches, the tower stays bf16.
VISION_TOWER_IGNORES = ("re:^model\\.visual\\..*", "re:^visual\\..*")
LM_HEAD = "lm_head"


def weight_args(method: Method, group_size: int = DEFAULT_GROUP_SIZE,
                act_order: bool = False, symmetric: bool = True, num_bits: int = 4
                ) -> QuantizationArgs:
    if method in FP8_METHODS:
        return QuantizationArgs(num_bits=8, type=QuantizationType.FLOAT,
                                strategy=QuantizationStrategy.CHANNEL, symmetric=True,
                                dynamic=False)
    # act-order is written as "weight": columns are quantized in activation order while groups
    # stay contiguous, so no g_idx is stored and every W4A16 kernel can run the checkpoint.
    return QuantizationArgs(num_bits=num_bits, type=QuantizationType.INT,
                            strategy=QuantizationStrategy.GROUP, group_size=group_size,
                            symmetric=symmetric, dynamic=False,
                            actorder="weight" if act_order else None)


def input_args(method: Method) -> QuantizationArgs | None:
    if method in FP8_METHODS:
        return QuantizationArgs(num_bits=8, type=QuantizationType.FLOAT,
                                strategy=QuantizationStrategy.TOKEN, symmetric=True, dynamic=True,
                                observer=None)
    return None


def quantization_config(method: Method, ignore: list[str], group_size: int = DEFAULT_GROUP_SIZE,
                        act_order: bool = False, symmetric: bool = True,
                        int8_targets: list[str] = ()) -> QuantizationConfig:
    """One config group for every Linear; with `int8_targets` (compressed-tensors targets,
    int8_target_patterns), a second for those at 8 bits: a name or pattern outranks the
    "Linear" class in compressed-tensors', vLLM's and our engine's matching alike."""
    groups = {"group_0": QuantizationScheme(
        targets=["Linear"], weights=weight_args(method, group_size, act_order, symmetric),
        input_activations=input_args(method))}
    if int8_targets:
        groups["group_1"] = QuantizationScheme(
            targets=list(int8_targets),
            weights=weight_args(method, group_size, act_order, symmetric, num_bits=8))
    return QuantizationConfig(config_groups=groups, ignore=ignore,
                              quantization_status=QuantizationStatus.FROZEN)


def int8_target_patterns(entries: list[str]) -> list[str]:
    """--int8-targets as compressed-tensors targets: `re:` patterns as they are, and a name
    (down_proj, or model.layers.3.mlp.down_proj) for every module whose name ends with it."""
    return [e if e.startswith("re:") else "re:(.*\\.)?" + re.escape(e) + "$" for e in entries]


def int8_linears(targets: dict[str, torch.nn.Linear], patterns: list[str]) -> set[str]:
    """The quantized Linears that `patterns` keep at 8 bits, checked: each pattern names at
    least one, and none splits a layer that vLLM and our engine run as one matmul (q/k/v,
    gate/up), which must share one format."""
    from compressed_tensors.utils.match import match_name

    from autoglm_serve.quantization.install import FUSED_PARTS

    chosen = set()
    for pattern in patterns:
        hits = {name for name in targets if match_name(name, pattern)}
        if not hits:
            raise ValueError(f"--int8-targets {pattern!r} names no quantized Linear layer")
        chosen |= hits
    for name in chosen:
        parent, _, leaf = name.rpartition(".")
        for fused, parts in FUSED_PARTS.items():
            siblings = {f"{parent}.{p}" for p in parts} & targets.keys()
            if leaf in parts and not siblings <= chosen:
                raise ValueError(f"--int8-targets keeps part of {parent}'s {', '.join(parts)} "
                                 f"at 8 bits; they run as one matmul ({fused}): name all of "
                                 "them or none")
    return chosen


def ignored_modules(model: torch.nn.Module) -> list[str]:
    """lm_head (its logits are the most sensitive, and it is tied to the embedding in small
    models) and, for a vision-language model, the vision tower."""
    ignore = [LM_HEAD]
    if any(name.startswith(("model.visual.", "visual.")) for name, _ in model.named_modules()):
        ignore.extend(VISION_TOWER_IGNORES)
    return ignore


def fitting_group_size(linears: dict[str, torch.nn.Linear], requested: int | None) -> int:
    """`requested`, checked; or 128, halved until it divides every input width (compressed-tensors
    and the W4A16 kernels need whole groups: SmolLM2's 576-wide layers get 64)."""
    widths = {m.in_features for m in linears.values()}
    if requested is not None:
        bad = sorted(w for w in widths if w % requested)
        if requested <= 0 or bad:
            raise ValueError(f"--group-size {requested} does not divide the input width(s) {bad} "
                             f"of the quantized layers")
        return requested
    size = DEFAULT_GROUP_SIZE
    while size > 8 and any(w % size for w in widths):
        size //= 2
    if any(w % size for w in widths):
        raise ValueError(f"no group size divides the input widths {sorted(widths)}")
    return size


def target_linears(model: torch.nn.Module, ignore: list[str]) -> dict[str, torch.nn.Linear]:
    """The Linear modules the config quantizes, by full name, matched as compressed-tensors does."""
    from compressed_tensors.utils.match import match_named_modules
    return dict(match_named_modules(model, ["Linear"], ignore))

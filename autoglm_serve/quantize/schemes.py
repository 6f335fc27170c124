"""What each `--method` writes: a compressed-tensors QuantizationConfig, and which modules it skips.

W4A16 (rtn, gptq, awq): symmetric int4 weights, one scale per `group_size` input channels,
16-bit activations; compressed-tensors stores it "pack-quantized" (8 int4 in an int32).
FP8 (fp8: rounded to nearest; gptq-fp8: by GPTQ): float8_e4m3 weights with one scale per output
channel and activations quantized per token at run time ("FP8_DYNAMIC"); stored
"float-quantized".
"""
from __future__ import annotations

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
                act_order: bool = False, symmetric: bool = True) -> QuantizationArgs:
    if method in FP8_METHODS:
        return QuantizationArgs(num_bits=8, type=QuantizationType.FLOAT,
                                strategy=QuantizationStrategy.CHANNEL, symmetric=True,
                                dynamic=False)
    # act-order is written as "weight": columns are quantized in activation order while groups
    # stay contiguous, so no g_idx is stored and every W4A16 kernel can run the checkpoint.
    return QuantizationArgs(num_bits=4, type=QuantizationType.INT,
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
                        act_order: bool = False, symmetric: bool = True) -> QuantizationConfig:
    scheme = QuantizationScheme(targets=["Linear"],
                                weights=weight_args(method, group_size, act_order, symmetric),
                                input_activations=input_args(method))
    return QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore,
                              quantization_status=QuantizationStatus.FROZEN)


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

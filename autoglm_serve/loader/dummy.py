"""Random weights for benchmarking and testing without a checkpoint (`--load-format dummy`)."""

from __future__ import annotations

import re
import zlib

import torch
from torch import nn

# RMSNorm/LayerNorm scales: `input_layernorm.weight`, `model.norm.weight`, GLM-4V vision `norm1.weight`, `q_norm.weight`.
_NORM_WEIGHT_RE = re.compile(r"(^|\.)\w*norm\w*\.weight$", re.IGNORECASE)
_IN_PLACE_UNIFORM = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@torch.no_grad()
def initialize_dummy_weights(model: nn.Module, seed: int = 0, low: float = -1e-3, high: float = 1e-3) -> None:
    """Fill every parameter with small uniform noise, norm scales with 1 + noise.

    Values are generated on each parameter's own device (no host round trip for a 9B model), and each
    parameter gets its own generator seeded from (seed, name), so a parameter's values do not depend
    on which other parameters the model has or their order. Norm scales near 1 keep activations
    finite through 40 bf16 layers, which all-small weights would not.
    """
    norm_params = _norm_weight_names(model)
    for name, param in model.named_parameters():
        if param.device.type == "meta":
            raise ValueError(f"parameter {name!r} is on the meta device; materialize the model (to_empty) first")
        generator = torch.Generator(device=param.device)
        generator.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
        if not param.is_floating_point():
            # Packed quantized weights (int4 in int32, etc.): random bits decode to values in range.
            param.random_(generator=generator)
            continue
        if param.dtype in _IN_PLACE_UNIFORM:
            param.uniform_(low, high, generator=generator)
        else:  # float8 and friends have no uniform_ kernel
            param.copy_(torch.empty(param.shape, device=param.device).uniform_(low, high, generator=generator))
        if name in norm_params:
            param.add_(1.0)


def _norm_weight_names(model: nn.Module) -> set[str]:
    """Norm scale parameters, found by module type (a *Norm class's own non-bias parameters) or by name."""
    names = {name for name, _ in model.named_parameters() if _NORM_WEIGHT_RE.search(name)}
    for module_name, module in model.named_modules():
        if "norm" in type(module).__name__.lower():
            prefix = f"{module_name}." if module_name else ""
            names.update(prefix + name for name, _ in module.named_parameters(recurse=False) if name != "bias")
    return names

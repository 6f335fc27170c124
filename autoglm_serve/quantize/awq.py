"""AWQ (Lin et al., 2023): before rounding, scale up the input channels that carry large
activations, so their weights get finer int4 steps, and fold the inverse scale into the op that
produces those inputs (an RMSNorm's weight, or the rows of the previous Linear). The model's
function is unchanged before quantization; per balance group the exponent alpha of
s = mean|x|^alpha is searched to minimise the group's output error after rounding.

Balance groups by module name, inside one decoder layer (Llama/SmolLM2 and GLM-4/GLM-4.1V):
input_layernorm -> q,k,v; post_attention_layernorm -> gate,up (or fused gate_up); up (the second
half of a fused gate_up) -> down; v -> o only without grouped-query attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from compressed_tensors.quantization import QuantizationArgs

from autoglm_serve.quantize.rtn import rtn_quantize

_ALPHAS = [i / 20 for i in range(20)]


@dataclass
class BalanceGroup:
    smooth: torch.nn.Module          # RMSNorm (its .weight) or Linear (rows `rows` of it)
    linears: list[torch.nn.Linear]   # all read the same input
    rows: slice | None = None        # for a Linear `smooth`: which output rows feed `linears`


def balance_groups(layer: torch.nn.Module) -> list[BalanceGroup]:
    mods = dict(layer.named_modules())
    groups = []
    qkv = [mods.get(f"self_attn.{n}_proj") for n in "qkv"]
    if "input_layernorm" in mods and all(qkv):
        groups.append(BalanceGroup(mods["input_layernorm"], qkv))
    v, o = mods.get("self_attn.v_proj"), mods.get("self_attn.o_proj")
    if v is not None and o is not None and v.out_features == o.in_features:
        groups.append(BalanceGroup(v, [o], slice(0, v.out_features)))
    norm, down = mods.get("post_attention_layernorm"), mods.get("mlp.down_proj")
    if "mlp.gate_up_proj" in mods:
        gate_up = mods["mlp.gate_up_proj"]
        if norm is not None:
            groups.append(BalanceGroup(norm, [gate_up]))
        if down is not None:
            half = gate_up.out_features // 2
            groups.append(BalanceGroup(gate_up, [down], slice(half, 2 * half)))
    elif "mlp.gate_proj" in mods and "mlp.up_proj" in mods:
        if norm is not None:
            groups.append(BalanceGroup(norm, [mods["mlp.gate_proj"], mods["mlp.up_proj"]]))
        if down is not None:
            groups.append(BalanceGroup(mods["mlp.up_proj"], [down], slice(0, mods["mlp.up_proj"].out_features)))
    return groups


class InputSampler:
    """Keeps up to `per_call` evenly spaced input rows of a Linear per forward call."""

    def __init__(self, linear: torch.nn.Linear, per_call: int):
        self.rows: list[torch.Tensor] = []
        self.per_call = per_call
        self._handle = linear.register_forward_pre_hook(self._observe)

    def _observe(self, _module, args) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1])
        step = max(1, x.shape[0] // self.per_call)
        self.rows.append(x[::step].float())

    def inputs(self) -> torch.Tensor:
        self._handle.remove()
        return torch.cat(self.rows)


@torch.no_grad()
def search_and_apply_scales(group: BalanceGroup, x: torch.Tensor,
                            args: QuantizationArgs | list[QuantizationArgs],
                            scale_dtype: torch.dtype, alphas: list[float] = _ALPHAS) -> float:
    """Find the best alpha for `group` on inputs `x`, fold the scales in; return alpha. `args`:
    one for every Linear of the group, or a list with each one's (some kept at 8 bits)."""
    per_linear = args if isinstance(args, list) else [args] * len(group.linears)
    x_mean = x.abs().mean(dim=0)
    reference = [x @ lin.weight.float().t() for lin in group.linears]
    best_alpha, best_err, best_s = 0.0, None, None
    for alpha in alphas:
        s = x_mean.pow(alpha).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        err = 0.0
        for lin, lin_args, ref in zip(group.linears, per_linear, reference):
            # plain min/max rounding in the search: 20x cheaper, and the final rounding clips
            q = rtn_quantize(lin.weight.float() * s, lin_args, scale_dtype, clip_search=False).weight / s
            err += (x @ q.t() - ref).pow(2).mean().item()
        if best_err is None or err < best_err:
            best_alpha, best_err, best_s = alpha, err, s
    if best_alpha == 0.0:
        return 0.0      # s is all ones: nothing to fold
    for lin in group.linears:
        lin.weight.mul_(best_s.to(lin.weight.dtype))
    smooth = group.smooth
    if isinstance(smooth, torch.nn.Linear):
        smooth.weight[group.rows].div_(best_s.unsqueeze(1).to(smooth.weight.dtype))
        if smooth.bias is not None:
            smooth.bias[group.rows].div_(best_s.to(smooth.bias.dtype))
    else:
        smooth.weight.div_(best_s.to(smooth.weight.dtype))
    return best_alpha

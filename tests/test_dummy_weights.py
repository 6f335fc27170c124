"""Dummy weights: deterministic, in range, norm scales near 1, finite through many bf16 layers."""

from __future__ import annotations

import torch
from torch import nn

from autoglm_serve.loader import initialize_dummy_weights


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(dim))  # not named "*norm.weight": found by module type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * self.scale


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.post_attention_layernorm = RMSNorm(dim)
        self.post_norm = nn.Module()
        self.post_norm.weight = nn.Parameter(torch.zeros(dim))  # a fused layer's norm: found by name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.post_attention_layernorm(self.proj(self.input_layernorm(x)))
        return x + h * self.post_norm.weight


def _model(layers: int = 40, dim: int = 64) -> nn.Module:
    return nn.Sequential(*[Block(dim) for _ in range(layers)])


def test_ranges_and_norms() -> None:
    model = _model(layers=2)
    initialize_dummy_weights(model, seed=0, low=-1e-3, high=1e-3)
    for name, param in model.named_parameters():
        is_norm_scale = name.endswith(("layernorm.weight", "post_attention_layernorm.scale", "post_norm.weight"))
        center = 1.0 if is_norm_scale else 0.0
        assert (param - center).abs().max() <= 1e-3, name
        assert param.std() > 0, name


def test_deterministic_and_seed_dependent() -> None:
    a, b, c = _model(layers=2), _model(layers=2), _model(layers=2)
    initialize_dummy_weights(a, seed=7)
    initialize_dummy_weights(b, seed=7)
    initialize_dummy_weights(c, seed=8)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name


def test_parameters_differ_from_each_other() -> None:
    model = _model(layers=2)
    initialize_dummy_weights(model)
    first, second = model[0].proj.weight, model[1].proj.weight
    assert not torch.equal(first, second)


def test_bf16_activations_stay_finite_through_40_layers() -> None:
    model = _model(layers=40).to(torch.bfloat16)
    initialize_dummy_weights(model)
    out = model(torch.randn(3, 64, dtype=torch.bfloat16))
    assert torch.isfinite(out).all()


def test_integer_parameters_get_random_bits() -> None:
    module = nn.Module()
    module.qweight = nn.Parameter(torch.zeros(16, 8, dtype=torch.int32), requires_grad=False)
    initialize_dummy_weights(module)
    assert module.qweight.unique().numel() > 100

"""Llama-family decoder (SmolLM2, Llama 2/3 without rope scaling) on the paged-attention engine."""
from __future__ import annotations

import torch
from torch import nn

from autoglm_serve.models.layers.attention import Attention, AttentionMetadata
from autoglm_serve.models.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from autoglm_serve.models.layers.linear import (LinearMethod, MergedColumnParallelLinear,
                                                 QKVParallelLinear, RowParallelLinear)
from autoglm_serve.models.layers.norm import RMSNorm
from autoglm_serve.models.layers.rotary import RotaryEmbedding
from autoglm_serve.models.rope_config import check_default_rope
from autoglm_serve.models.weights import check_all_loaded, load_stacked_weights


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class SelfAttention(nn.Module):
    """Fused qkv projection, rotary and paged attention (one op: a backend may fuse them), output
    projection."""

    def __init__(self, config, rotary: RotaryEmbedding, qkv_bias: bool, o_bias: bool,
                 linear_method: LinearMethod | None, dtype):
        super().__init__()
        self.head_dim = head_dim_of(config)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim,
                                          config.num_attention_heads, config.num_key_value_heads,
                                          bias=qkv_bias, linear_method=linear_method, dtype=dtype)
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim,
                                        config.hidden_size, bias=o_bias,
                                        linear_method=linear_method, dtype=dtype)
        self.q_size = self.qkv_proj.num_heads * self.head_dim
        self.kv_size = self.qkv_proj.num_kv_heads * self.head_dim
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, self.head_dim,
                              scale=self.head_dim ** -0.5, rotary=rotary)

    def forward(self, rope, hidden, meta: AttentionMetadata, fp8_rows=None):
        """fp8_rows: the hidden rows quantized per token where the norm before did it."""
        qkv = self.qkv_proj(hidden, fp8_rows)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return self.o_proj(self.attn(q, k, v, meta, rope))


class GatedMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, linear_method, dtype):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2,
                                                       linear_method=linear_method, dtype=dtype)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size,
                                           linear_method=linear_method, dtype=dtype)

    def forward(self, x, fp8_rows=None):
        # at decode one GEMV computes silu(gate) * up without writing the [gate | up] projection
        act = self.gate_up_proj.linear_method.apply_gated_silu(self.gate_up_proj, x, fp8_rows)
        if act is not None:
            return self.down_proj(act)
        return self.down_proj.forward_silu_and_mul(self.gate_up_proj(x, fp8_rows))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, rotary, linear_method, dtype):
        super().__init__()
        bias = getattr(config, "attention_bias", False)
        self.self_attn = SelfAttention(config, rotary, bias, bias, linear_method, dtype)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, linear_method, dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(self, rope, hidden, residual, meta):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(rope, hidden, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):
    """Embedding, a stack of decoder layers passing (hidden, residual), final norm."""

    def __init__(self, config, layer_factory, dtype, rotary: RotaryEmbedding):
        super().__init__()
        self.rotary = rotary     # shared by all layers: cos/sin computed once per forward
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList([layer_factory() for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(self, input_ids, positions, meta, inputs_embeds=None):
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        rope = self.rotary.cos_sin(positions)
        for layer in self.layers:
            hidden, residual = layer(rope, hidden, residual, meta)
        return self.norm(hidden, residual)[0]


class CausalLM(nn.Module):
    """A decoder plus LM head; subclasses choose the layer."""

    # checkpoint names that are not parameters here (rotary caches of old checkpoints)
    skip_weights = ("rotary_emb.inv_freq",)

    def __init__(self, config, model: DecoderModel, dtype):
        super().__init__()
        self.config = config
        self.model = model
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids, positions, meta, inputs_embeds=None):
        return self.model(input_ids, positions, meta, inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights) -> None:
        skip = self.skip_weights + (("lm_head.",) if self.tie_word_embeddings else ())
        loaded = load_stacked_weights(self, weights, skip=skip, rename=self.rename_weight)
        check_all_loaded(self, loaded, tied=("lm_head.weight",) if self.tie_word_embeddings else ())

    def rename_weight(self, name: str) -> str | None:
        return name


class LlamaForCausalLM(CausalLM):
    def __init__(self, config, linear_method=None, dtype=None):
        rope = check_default_rope(config)
        hd = head_dim_of(config)
        rotary = RotaryEmbedding(hd, hd, config.max_position_embeddings, rope["rope_theta"],
                                 interleaved=False)
        model = DecoderModel(config, lambda: LlamaDecoderLayer(config, rotary, linear_method, dtype),
                             dtype, rotary)
        super().__init__(config, model, dtype)

"""GLM-4-0414 decoder (``Glm4ForCausalLM``), also the text stack of GLM-4.1V / AutoGLM-Phone-9B.

Differs from Llama in: four RMSNorms per layer (the attention and MLP outputs are normed again
before the residual add), partial interleaved rotary (half of each head), q/k/v bias, and a
checkpoint that stores gate and up fused as ``gate_up_proj``.
"""
from __future__ import annotations

from torch import nn

from autoglm_serve.models.layers.norm import RMSNorm
from autoglm_serve.models.layers.rotary import RotaryEmbedding
from autoglm_serve.models.llama import (CausalLM, DecoderModel, GatedMLP, SelfAttention,
                                        head_dim_of)
from autoglm_serve.models.rope_config import check_default_rope


class Glm4DecoderLayer(nn.Module):
    def __init__(self, config, rotary, linear_method, dtype):
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = SelfAttention(config, rotary, getattr(config, "attention_bias", True),
                                       False, linear_method, dtype)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, linear_method, dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype)
        self.post_self_attn_layernorm = RMSNorm(config.hidden_size, eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype)
        self.post_mlp_layernorm = RMSNorm(config.hidden_size, eps, dtype)

    def forward(self, rope, hidden, residual, meta):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_self_attn_layernorm(self.self_attn(rope, hidden, meta))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.post_mlp_layernorm(self.mlp(hidden)), residual


def glm4_rotary(config) -> RotaryEmbedding:
    rope = check_default_rope(config)
    hd = head_dim_of(config)
    rotary_dim = int(hd * rope.get("partial_rotary_factor", 0.5))
    return RotaryEmbedding(hd, rotary_dim, config.max_position_embeddings, rope["rope_theta"],
                           interleaved=True)


class Glm4ForCausalLM(CausalLM):
    def __init__(self, config, linear_method=None, dtype=None, rotary: RotaryEmbedding | None = None):
        rotary = rotary or glm4_rotary(config)
        model = DecoderModel(config, lambda: Glm4DecoderLayer(config, rotary, linear_method, dtype),
                             dtype, rotary)
        super().__init__(config, model, dtype)

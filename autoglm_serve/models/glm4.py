"""GLM-4-0414 decoder (``Glm4ForCausalLM``), also the text stack of GLM-4.1V / AutoGLM-Phone-9B.

Differs from Llama in: four RMSNorms per layer (the attention and MLP outputs are normed again
before the residual add: each such norm, the add and the norm after it run as one fused pair),
partial interleaved rotary (half of each head), q/k/v bias, and a checkpoint that stores gate and
up fused as ``gate_up_proj``.
"""
from __future__ import annotations

from torch import nn

from autoglm_serve.models.layers.norm import RMSNorm, rms_norm_pair
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

    def forward(self, rope, hidden, residual, meta, hidden_norm: RMSNorm | None):
        """hidden: the embeddings (residual None) or the previous layer's MLP output still owing
        its post_mlp_layernorm, ``hidden_norm``. Returns this layer's MLP output, likewise before
        its post_mlp_layernorm, and the residual."""
        # an FP8 qkv or gate_up quantizes its rows per token: the norm pair before it has each
        # row in registers and writes them quantized too (and their amax, for the one-row GEMV)
        if residual is None:
            residual, hidden, fp8_rows = hidden, self.input_layernorm(hidden), None
        else:
            hidden, residual, fp8_rows = rms_norm_pair(
                hidden_norm, self.input_layernorm, hidden, residual,
                self.self_attn.qkv_proj.linear_method.takes_fp8_rows)
        hidden, residual, fp8_rows = rms_norm_pair(
            self.post_self_attn_layernorm, self.post_attention_layernorm,
            self.self_attn(rope, hidden, meta, fp8_rows), residual,
            self.mlp.gate_up_proj.linear_method.takes_fp8_rows)
        return self.mlp(hidden, fp8_rows), residual


class Glm4Model(DecoderModel):
    """A layer's post_mlp_layernorm is applied by the next norm in line (the next layer's
    input_layernorm or the final norm) together with the residual add and its own norm: one
    fused kernel where there were two."""

    def forward(self, input_ids, positions, meta, inputs_embeds=None):
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        hidden_norm = None
        rope = self.rotary.cos_sin(positions)
        for layer in self.layers:
            hidden, residual = layer(rope, hidden, residual, meta, hidden_norm)
            hidden_norm = layer.post_mlp_layernorm
        return rms_norm_pair(hidden_norm, self.norm, hidden, residual)[0]


def glm4_rotary(config) -> RotaryEmbedding:
    rope = check_default_rope(config)
    hd = head_dim_of(config)
    rotary_dim = int(hd * rope.get("partial_rotary_factor", 0.5))
    return RotaryEmbedding(hd, rotary_dim, config.max_position_embeddings, rope["rope_theta"],
                           interleaved=True)


class Glm4ForCausalLM(CausalLM):
    def __init__(self, config, linear_method=None, dtype=None, rotary: RotaryEmbedding | None = None):
        rotary = rotary or glm4_rotary(config)
        model = Glm4Model(config, lambda: Glm4DecoderLayer(config, rotary, linear_method, dtype),
                          dtype, rotary)
        super().__init__(config, model, dtype)

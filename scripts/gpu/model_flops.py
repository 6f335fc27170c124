"""FLOP counts of GLM-4.1V (AutoGLM-Phone-9B) work, from its config.json: the compute floors
that engine_bench.py sets next to its measured figures (FLOPs / measured bf16 matmul peak)."""
from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGED_CONFIG = os.path.join(ROOT, "autoglm_serve", "models", "configs", "autoglm-phone-9b",
                               "config.json")


def load_model_config() -> dict:
    with open(PACKAGED_CONFIG) as f:
        return json.load(f)


def decoder_flops_per_token(tc: dict) -> float:
    h, hd, inter = tc["hidden_size"], tc["head_dim"], tc["intermediate_size"]
    nh, kv = tc["num_attention_heads"], tc["num_key_value_heads"]
    per_layer = h * (nh + 2 * kv) * hd + nh * hd * h + h * 2 * inter + inter * h
    return 2.0 * tc["num_hidden_layers"] * per_layer


def causal_attn_flops(tc: dict, q: int, ctx: int = 0) -> float:
    """QK^T and PV of q new tokens after ctx cached ones."""
    width = tc["num_attention_heads"] * tc["head_dim"]
    return 4.0 * tc["num_hidden_layers"] * width * (q * ctx + q * (q + 1) / 2)


def vision_flops(vc: dict, patches: int) -> float:
    h, out, inter, merge = (vc["hidden_size"], vc["out_hidden_size"], vc["intermediate_size"],
                            vc["spatial_merge_size"])
    patch_dim = vc["in_channels"] * vc["temporal_patch_size"] * vc["patch_size"] ** 2
    tokens = patches // merge ** 2
    block = 2 * patches * (4 * h * h + 3 * h * out) + 4 * h * patches ** 2   # MLP is out wide
    merger = 2 * tokens * (merge ** 2 * h * out + out * out + 3 * out * inter)
    return vc["depth"] * block + merger + 2 * patches * patch_dim * h


def ttft_flops(cfg: dict, prompt_tokens: int, image_tokens: int) -> float:
    tc, vc = cfg["text_config"], cfg["vision_config"]
    merge = vc["spatial_merge_size"]
    return (decoder_flops_per_token(tc) * prompt_tokens + causal_attn_flops(tc, prompt_tokens)
            + 2 * tc["hidden_size"] * tc["vocab_size"]
            + vision_flops(vc, image_tokens * merge * merge))


def offline_flops(cfg: dict, n_req: int, in_len: int, out_len: int) -> float:
    """Prefill and decode of every request: the compute floor of the throughput figure."""
    tc = cfg["text_config"]
    per_req = (decoder_flops_per_token(tc) * (in_len + out_len) + causal_attn_flops(tc, in_len + out_len)
               + out_len * 2 * tc["hidden_size"] * tc["vocab_size"])
    return n_req * per_req


"""Tiny random decoder checkpoints (float32) for oracle tests against transformers."""
from __future__ import annotations

from pathlib import Path

import torch


def build_tiny_decoder(out_dir: str | Path, arch: str, seed: int = 0, vocab_size: int = 128,
                       max_position_embeddings: int = 512, **sizes):
    """Saves a random LlamaForCausalLM or Glm4ForCausalLM; returns (path, hf_model). ``sizes``
    override the tiny dimensions (hidden_size, num_attention_heads, head_dim, ...)."""
    from transformers import Glm4Config, Glm4ForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=max_position_embeddings, eos_token_id=vocab_size - 1,
                  bos_token_id=0, pad_token_id=0, tie_word_embeddings=False)
    common.update(sizes)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "glm4":
        model = Glm4ForCausalLM(Glm4Config(**common, attention_bias=True,
                                           partial_rotary_factor=0.5))
    else:
        raise ValueError(arch)
    # Larger than default init so logits are peaked enough that greedy paths are stable; scaled
    # with the width so that wider models keep the tiny one's activation sizes.
    std = 0.15 * (64 / common["hidden_size"]) ** 0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, std)
    model.eval()
    path = Path(out_dir)
    model.save_pretrained(path)
    return path, model

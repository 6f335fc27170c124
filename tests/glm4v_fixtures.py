"""A tiny random GLM-4.1V checkpoint directory for tests (not a test itself).

``make_tiny_glm4v(path)`` writes config.json, model.safetensors (random weights, checkpoint names
``model.visual.*`` / ``model.language_model.*`` / ``lm_head.*``), a byte-level tokenizer whose GLM
tokens sit at the end of the vocab, GLM-4.1V's chat template,
preprocessor_config.json and generation_config.json. Everything is built in code: no hub.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from autoglm_serve.models.configs.glm_tokenizer import (NUM_GLM_TOKENS, byte_level_glm_tokenizer,
                                                       glm_token_ids)

BASE_VOCAB = 256                                   # one token per byte, no merges
TINY_VOCAB = BASE_VOCAB + NUM_GLM_TOKENS           # GLM's tokens are the last ids
SPECIAL_IDS = glm_token_ids(BASE_VOCAB)


def tiny_glm4v_config(max_position_embeddings: int = 4096):
    """A Glm4vConfig with every GLM-4.1V feature but tiny sizes (head_dim 32 so that the real
    mrope_section [8, 12, 12] scales to an integer split [2, 3, 3] of its 8 rotary frequencies)."""
    from transformers import Glm4vConfig

    return Glm4vConfig(
        text_config=dict(
            vocab_size=TINY_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=True,
            max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-5,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                                 mrope_section=[2, 3, 3]),
            pad_token_id=SPECIAL_IDS["<|endoftext|>"],
            eos_token_id=[SPECIAL_IDS[t] for t in ("<|endoftext|>", "<|user|>", "<|observation|>")],
        ),
        vision_config=dict(
            depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=128,
            patch_size=14, temporal_patch_size=2, spatial_merge_size=2, image_size=336,
            rms_norm_eps=1e-5,
        ),
        image_token_id=SPECIAL_IDS["<|image|>"],
        video_token_id=SPECIAL_IDS["<|video|>"],
        image_start_token_id=SPECIAL_IDS["<|begin_of_image|>"],
        image_end_token_id=SPECIAL_IDS["<|end_of_image|>"],
        video_start_token_id=SPECIAL_IDS["<|begin_of_video|>"],
        video_end_token_id=SPECIAL_IDS["<|end_of_video|>"],
        tie_word_embeddings=False,
    )


def tiny_tokenizer():
    """Byte-level, no merges: any text round-trips, ids 0..255 are bytes, GLM's specials after."""
    return byte_level_glm_tokenizer(first_special_id=BASE_VOCAB)


PREPROCESSOR_CONFIG = {
    "size": {"shortest_edge": 12544, "longest_edge": 9633792},
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "rescale_factor": 1 / 255,
    "resample": 3,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Glm4vImageProcessor",
    "processor_class": "Glm4vProcessor",
}


def make_tiny_glm4v(path: str | os.PathLike, seed: int = 0,
                    max_position_embeddings: int = 4096) -> Path:
    """Write the tiny checkpoint into ``path`` (created if needed) and return it."""
    from transformers import Glm4vForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = tiny_glm4v_config(max_position_embeddings)
    model = Glm4vForConditionalGeneration(config).eval()
    # post_init draws tiny weights (std 0.02); widen the norms and biases so a test notices swaps
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if "norm" in name and "weight" in name else 0.0))
    model.save_pretrained(path, safe_serialization=True)

    tiny_tokenizer().save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    # as GLM-4.1V's published one: </answer> stops too; do_sample is no sampling default
    gen = {"eos_token_id": config.text_config.eos_token_id + [SPECIAL_IDS["</answer>"]],
           "pad_token_id": SPECIAL_IDS["<|endoftext|>"], "do_sample": True}
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return path

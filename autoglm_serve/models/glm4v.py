"""GLM-4.1V (``Glm4vForConditionalGeneration``): AutoGLM-Phone-9B's architecture.

The GLM-4 decoder of models/glm4.py with 3-D M-RoPE, plus the vision tower whose outputs replace
the ``<|image|>`` placeholder embeddings (the runner does the placing; see engine/core/runner.py).
"""
from __future__ import annotations

import torch
from torch import nn

from autoglm_serve.models.glm4 import Glm4ForCausalLM
from autoglm_serve.models.glm4v_vision import Glm4vVisionTower
from autoglm_serve.models.layers.rotary import RotaryEmbedding
from autoglm_serve.models.llama import head_dim_of
from autoglm_serve.models.rope_config import rope_parameters


class MRotaryEmbedding(RotaryEmbedding):
    """Interleaved partial rotary whose frequencies read the temporal, height or width row of
    [3, T] positions by section (``mrope_section``); text-only positions are the same in all
    three rows, which reduces to plain GLM-4 rotary."""

    def __init__(self, head_dim, rotary_dim, max_position, base, mrope_section):
        super().__init__(head_dim, rotary_dim, max_position, base, interleaved=True)
        if sum(mrope_section) != rotary_dim // 2:
            raise ValueError(f"mrope_section {mrope_section} must sum to {rotary_dim // 2}")
        rows = torch.repeat_interleave(torch.arange(len(mrope_section)) % 3,
                                       torch.tensor(list(mrope_section)))
        self.register_buffer("section_rows", rows, persistent=False)

    def cos_sin(self, positions):
        if positions.dim() == 1:
            return super().cos_sin(positions)
        # per frequency k: the angle of row section_rows[k] of the positions
        freq_idx = torch.arange(self.section_rows.numel(), device=positions.device)
        pos = positions[self.section_rows].t()                 # [T, F]
        return self.cos_cache[pos, freq_idx], self.sin_cache[pos, freq_idx]


def glm4v_rotary(text_config) -> MRotaryEmbedding:
    """The language model's M-RoPE, from GLM-4.1V's text config."""
    rope = rope_parameters(text_config)
    hd = head_dim_of(text_config)
    rotary_dim = int(hd * rope.get("partial_rotary_factor", 0.5))
    section = rope.get("mrope_section") or [8, 12, 12]
    return MRotaryEmbedding(hd, rotary_dim, text_config.max_position_embeddings,
                            rope["rope_theta"], section)


def _text_name(name: str) -> str | None:
    """Checkpoint names (GLM-4.1V / AutoGLM-Phone-9B, both layouts) → our language model's."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    if name.startswith("lm_head."):
        return name
    if name.startswith("model."):          # older layout: text stack directly under model.
        return name
    return None


class Glm4vForConditionalGeneration(nn.Module):
    uses_mrope = True

    def __init__(self, config, linear_method=None, dtype=None):
        super().__init__()
        self.config = config
        tcfg = config.text_config
        self.language_model = Glm4ForCausalLM(tcfg, linear_method, dtype,
                                              rotary=glm4v_rotary(tcfg))
        self.visual = Glm4vVisionTower(config.vision_config).to(dtype or torch.float32)
        self.image_token_id = config.image_token_id
        self.spatial_merge_size = config.vision_config.spatial_merge_size

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model.get_input_embeddings(input_ids)

    def embed_images(self, pixel_values: torch.Tensor, grid_thw: list) -> torch.Tensor:
        """[num_patches, C*T*P*P] → [num_image_tokens, hidden] for the images in order."""
        return self.visual(pixel_values.to(self.visual_dtype), grid_thw)

    def flops_per_text_token(self) -> float:
        """The language model's FLOPs (2 a multiply-add) for one token through its layers,
        from the config (a quantized layer does the same arithmetic)."""
        c = self.config.text_config
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        h = c.hidden_size
        attn = h * hd * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)   # q, o, k, v
        return 2.0 * c.num_hidden_layers * (attn + 3 * h * c.intermediate_size)

    def begin_images(self, pixel_values: torch.Tensor, grid_thw: list):
        """embed_images in steps: a VisionEncoding to advance block by block."""
        return self.visual.begin(pixel_values.to(self.visual_dtype), grid_thw)

    def image_features_like(self, num_rows: int, device: torch.device) -> torch.Tensor:
        """A buffer for the features of an image another tensor-parallel rank encodes."""
        return torch.empty(num_rows, self.visual.out_hidden, dtype=self.visual_dtype,
                           device=device)

    @property
    def visual_dtype(self) -> torch.dtype:
        return next(self.visual.parameters()).dtype

    def forward(self, input_ids, positions, meta, inputs_embeds=None):
        return self.language_model(input_ids, positions, meta, inputs_embeds)

    def compute_logits(self, hidden):
        return self.language_model.compute_logits(hidden)

    def load_weights(self, weights) -> None:
        vision: list[tuple[str, torch.Tensor]] = []

        def text_weights():
            for name, tensor in weights:
                if name.startswith(("model.visual.", "visual.")):
                    vision.append((name, tensor))
                    continue
                renamed = _text_name(name)
                if renamed is None:
                    raise ValueError(f"checkpoint tensor {name!r} has no parameter in "
                                     "Glm4vForConditionalGeneration")
                yield renamed, tensor

        self.language_model.load_weights(text_weights())
        loaded = self.visual.load_weights(vision)
        missing = [n for n, _ in self.visual.named_parameters() if n not in loaded]
        if missing:
            raise ValueError(f"checkpoint is missing vision tensors: {missing[:5]}")

"""A rendered prompt's images → a prompt the engine can run.

The images a chat template placed (engine/frontend/chat_template.py finds them in the messages) are
loaded under the media policy, and their single
``<|image|>`` placeholders in the tokenized prompt expanded to one token per merged patch, with
the M-RoPE positions that go with them.
"""
from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from autoglm_serve.models.mrope import get_mrope_positions
from autoglm_serve.multimodal.image_processor import Glm4vImageProcessor
from autoglm_serve.multimodal.inputs import MultiModalItem
from autoglm_serve.multimodal.media import LoadedImage, MediaError, MediaLoader, MediaPolicy
from autoglm_serve.multimodal.prompt import expand_image_tokens

DEFAULT_IMAGE_LIMIT = 10


@dataclass
class MultiModalPrompt:
    token_ids: list[int]
    items: list[MultiModalItem]
    mrope: tuple | None          # (positions [3, L], delta)


class MultiModalProcessor:
    """The engine's front-end: images are hashed and their placeholders expanded here; the core
    resizes them and lays them out into patches on its device (MultiModalItem.patches)."""

    def __init__(self, hf_config, model_dir, mm_processor_kwargs: dict | None = None,
                 limit_mm_per_prompt: dict | None = None, policy: MediaPolicy | None = None):
        self.image_processor = Glm4vImageProcessor.from_pretrained(model_dir,
                                                                   **(mm_processor_kwargs or {}))
        self.image_token_id = hf_config.image_token_id
        # what a prompt says for one image before expansion (vLLM's placeholder for GLM-4.1V)
        self.placeholder_ids = (hf_config.image_start_token_id, hf_config.image_token_id,
                                hf_config.image_end_token_id)
        self.merge = hf_config.vision_config.spatial_merge_size
        self.max_images = int((limit_mm_per_prompt or {}).get("image", DEFAULT_IMAGE_LIMIT))
        self.loader = MediaLoader(policy)

    def load_images(self, urls: list[str]) -> list[LoadedImage]:
        if len(urls) > self.max_images:
            raise MediaError(f"at most {self.max_images} images per prompt are allowed "
                             f"(--limit-mm-per-prompt), got {len(urls)}")
        return [self.loader.load(u) for u in urls]

    def build(self, token_ids: list[int], images: list[Image.Image | LoadedImage]
              ) -> MultiModalPrompt:
        if len(images) > self.max_images:
            raise MediaError(f"at most {self.max_images} images per prompt are allowed "
                             f"(--limit-mm-per-prompt), got {len(images)}")
        loaded = [i if isinstance(i, LoadedImage) else LoadedImage.of(i, "pil") for i in images]
        try:
            grids = [self.image_processor.grid_thw(*i.pixels.shape[:2]) for i in loaded]
        except ValueError as exc:   # a shape the model cannot take (aspect ratio over 200)
            raise MediaError(str(exc)) from None
        expanded = expand_image_tokens(token_ids, self.image_token_id, grids, self.merge)
        positions, delta = get_mrope_positions(expanded.token_ids, self.image_token_id, grids,
                                               self.merge)
        items = [MultiModalItem(content_hash=img.content_hash, offset=start, length=length,
                                pixel_values=img.pixels, grid_thw=grid,
                                layout=self.image_processor.config)
                 for img, grid, (start, length) in zip(loaded, grids, expanded.image_ranges)]
        return MultiModalPrompt(expanded.token_ids, items, (positions, delta))

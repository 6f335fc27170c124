"""A prompt's images as the engine carries them: one ``MultiModalItem`` per image.

It lives here, below the engine, so that the multimodal processor that makes the items and the
engine that runs them both import it without importing each other.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autoglm_serve.host_transfer import to_device
from autoglm_serve.multimodal.image_processor import Glm4vImageProcessor, ImageProcessorConfig


@dataclass
class MultiModalItem:
    """One image of a prompt, as the runner needs it."""
    content_hash: str             # identifies the image for the prefix and encoder caches
    offset: int                   # first placeholder token in the prompt
    length: int                   # number of placeholder tokens
    pixel_values: torch.Tensor    # [num_patches, C*T*P*P]; with ``layout``: the RGB image
    grid_thw: tuple[int, int, int]
    # Set while pixel_values holds the (H, W, C) uint8 RGB image at its own size, which the
    # core resizes (bit for bit PIL's bicubic) to ``grid_thw`` and lays out into patches on its
    # own device: the front-end's ~44 ms of PIL resize per screenshot are gone, 8x fewer bytes
    # than the patches cross, and a GPU does both in well under a millisecond.
    layout: ImageProcessorConfig | None = None

    def patches(self, device: torch.device) -> torch.Tensor:
        """The image's patches on ``device``, made when the vision tower needs them and not
        kept: a request keeps its small RGB image on the host while it waits and runs (the
        float32 patches of a phone screenshot are 58 MB; 16 agents' held ~0.9 GiB of a 24 GB
        card's device memory)."""
        if self.layout is None:
            return self.pixel_values.to(device)
        processor = Glm4vImageProcessor(self.layout)
        laid_out = processor.patches(processor.resize(to_device(self.pixel_values, torch.uint8,
                                                                device)))
        if laid_out.grid_thw != self.grid_thw:
            raise ValueError(f"the image lays out to {laid_out.grid_thw}, its prompt expects "
                             f"{self.grid_thw}")
        return laid_out.pixel_values

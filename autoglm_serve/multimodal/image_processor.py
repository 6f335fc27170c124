"""GLM-4.1V image preprocessing: PIL image -> flattened patches, the same numbers as
transformers' Glm4vImageProcessor (PIL backend).

Steps: composite transparency on white and convert to RGB; resize (PIL's bicubic: PIL itself on
a CPU, bit for bit in torch on a GPU, multimodal/resize.py) so that both sides are multiples of
patch*merge (28) and 2*h*w lies within [min_pixels, max_pixels]; scale to [0, 1] (in float64,
then float32, as transformers does); normalize with the CLIP mean/std; cut into 14x14 patches
in merge-window order (the 2x2 patches of one LLM token are adjacent); repeat each patch
temporal_patch_size times (a still image is a 2-frame clip to the Conv3d). One row of
``pixel_values`` is laid out (C, T, P, P), the order the patch embedding expects.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from autoglm_serve.host_transfer import to_device
from autoglm_serve.multimodal.resize import resize_bicubic

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class ImageProcessorConfig:
    min_pixels: int = 112 * 112
    max_pixels: int = 28 * 28 * 15000       # transformers' class default; checkpoints set 9,633,792
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = Image.Resampling.BICUBIC

    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike | None, **overrides: Any) -> "ImageProcessorConfig":
        """Defaults from ``<model_dir>/preprocessor_config.json`` when present, then ``overrides``
        (the server's ``--mm-processor-kwargs``: ``max_pixels``, ``min_pixels``, ...)."""
        cfg = cls()
        path = Path(model_dir) / "preprocessor_config.json" if model_dir is not None else None
        if path is not None and path.is_file():
            raw = json.loads(path.read_text())
            size = raw.get("size") or {}
            cfg.min_pixels = int(size.get("shortest_edge", raw.get("min_pixels", cfg.min_pixels)))
            cfg.max_pixels = int(size.get("longest_edge", raw.get("max_pixels", cfg.max_pixels)))
            for key in ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor", "resample"):
                if key in raw:
                    setattr(cfg, key, type(getattr(cfg, key))(raw[key]))
            for key in ("image_mean", "image_std"):
                if key in raw:
                    setattr(cfg, key, tuple(float(v) for v in raw[key]))
        for key, value in overrides.items():
            if not hasattr(cfg, key):
                raise ValueError(f"unknown image processor option {key!r}")
            setattr(cfg, key, type(getattr(cfg, key))(value) if not isinstance(value, (list, tuple)) else tuple(value))
        if cfg.min_pixels > cfg.max_pixels:
            raise ValueError(f"min_pixels ({cfg.min_pixels}) must not exceed max_pixels ({cfg.max_pixels})")
        if cfg.resample != Image.Resampling.BICUBIC:
            raise ValueError(f"only bicubic resampling ({int(Image.Resampling.BICUBIC)}) is supported, "
                             f"got {cfg.resample}")
        return cfg


@dataclass
class ProcessedImage:
    pixel_values: torch.Tensor              # [t*h*w patches, C*T*P*P] float32
    grid_thw: tuple[int, int, int]          # in patches, before merging
    num_tokens: int                         # LLM tokens: t*h*w / merge**2
    resized_hw: tuple[int, int] = field(default=(0, 0))


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 112 * 112,
                 max_pixels: int = 28 * 28 * 15000, temporal_factor: int = 2) -> tuple[int, int]:
    """Target (height, width): multiples of ``factor``, aspect kept, ``temporal_factor*h*w`` in range.

    Mirrors transformers' rule, including its quirks: tiny sides are first scaled up to
    ``factor``; the pixel budget counts both frames of the duplicated still image.
    """
    frames = temporal_factor   # a still image is fed as temporal_factor identical frames
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"image aspect ratio must be below 200, got {max(height, width) / min(height, width):.1f}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB with any transparency composited over white (what the model was trained on); an RGB
    image is returned as it is."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def rgb_pixels(image: Image.Image) -> torch.Tensor:
    """The image's RGB bytes (``to_rgb``) as an (H, W, 3) uint8 tensor, at its own size."""
    rgb = to_rgb(image)
    # one copy out of PIL (which keeps RGB as 4 bytes a pixel); a bytearray is writable, so
    # torch takes it as it is
    data = bytearray(rgb.tobytes())
    return torch.frombuffer(data, dtype=torch.uint8).view(rgb.height, rgb.width, 3)


class Glm4vImageProcessor:
    def __init__(self, config: ImageProcessorConfig | None = None):
        self.config = config or ImageProcessorConfig()

    @classmethod
    def from_pretrained(cls, model_dir: str | os.PathLike | None, **overrides: Any) -> "Glm4vImageProcessor":
        return cls(ImageProcessorConfig.from_pretrained(model_dir, **overrides))

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        c = self.config
        return smart_resize(height, width, factor=c.patch_size * c.merge_size, min_pixels=c.min_pixels,
                            max_pixels=c.max_pixels, temporal_factor=c.temporal_patch_size)

    def num_image_tokens(self, height: int, width: int) -> int:
        """LLM tokens for an image of this size, without decoding it (for admission/limits)."""
        h, w = self.target_size(height, width)
        return (h // self.config.patch_size) * (w // self.config.patch_size) // self.config.merge_size ** 2

    def __call__(self, image: Image.Image, device: torch.device | str | None = None
                 ) -> ProcessedImage:
        """Resize, scaling, normalization and patch layout on ``device`` when given (a GPU does
        them for a phone screenshot in well under a millisecond)."""
        pixels = rgb_pixels(image)
        if device is not None:
            pixels = pixels.to(device)
        return self.patches(self.resize(pixels))

    def resize(self, pixels: torch.Tensor) -> torch.Tensor:
        """RGB (H, W, C) uint8 pixels at their target size, on their device: the same pixels as
        PIL's bicubic resize, 8x fewer bytes than their patches."""
        height, width = self.target_size(pixels.shape[0], pixels.shape[1])
        if pixels.device.type == "cpu":
            # PIL itself: the same pixels, in half the time of the torch gathers on a CPU
            resized = Image.fromarray(pixels.numpy(), "RGB").resize((width, height),
                                                                   Image.Resampling.BICUBIC)
            return torch.from_numpy(np.array(resized))
        return resize_bicubic(pixels, (height, width))

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """The patch grid of an image of this size, once resized."""
        p = self.config.patch_size
        h, w = self.target_size(height, width)
        return 1, h // p, w // p

    def patches(self, pixels: torch.Tensor) -> ProcessedImage:
        """A resized image (H, W, C) uint8 → its patches, on the pixels' device."""
        c = self.config
        h, w = pixels.shape[:2]
        # float64 scaling then float32, as transformers does (x / 255 rounded once)
        pixels = (pixels.double() * c.rescale_factor).float()
        # queued, not synchronous: the engine core lays images out while a step runs
        mean = to_device(c.image_mean, torch.float32, pixels.device)
        std = to_device(c.image_std, torch.float32, pixels.device)
        pixels = ((pixels - mean) / std).permute(2, 0, 1)          # C, H, W

        p, m, tp = c.patch_size, c.merge_size, c.temporal_patch_size
        channels = pixels.shape[0]
        gh, gw = h // p, w // p
        patches = pixels.reshape(channels, gh // m, m, p, gw // m, m, p)
        patches = patches.permute(1, 4, 2, 5, 0, 3, 6)             # gh/m, gw/m, m, m, C, p, p
        patches = patches.unsqueeze(5).expand(*patches.shape[:5], tp, p, p)
        flat = patches.reshape(gh * gw, channels * tp * p * p)
        return ProcessedImage(
            pixel_values=flat,
            grid_thw=(1, gh, gw),
            num_tokens=gh * gw // (m * m),
            resized_hw=(h, w),
        )

    def batch(self, images: list[Image.Image]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Concatenated pixel_values, image_grid_thw [N, 3] (int64) and token counts, for one call of the tower."""
        done = [self(img) for img in images]
        pixel_values = torch.cat([d.pixel_values for d in done]) if done else torch.empty(0)
        grid = torch.tensor([d.grid_thw for d in done], dtype=torch.long).reshape(-1, 3)
        return pixel_values, grid, [d.num_tokens for d in done]

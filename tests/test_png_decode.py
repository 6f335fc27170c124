"""PNGs decoded by libspng (multimodal/png_decode.py) give Pillow's pixels, and every PNG the fast
path does not take still follows Pillow's rules through the media loader."""
from __future__ import annotations

import base64
import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, PngImagePlugin

from autoglm_serve.multimodal.image_processor import rgb_pixels
from autoglm_serve.multimodal.media import MediaError, MediaLoader
from autoglm_serve.multimodal.png_decode import spng_rgb_pixels

SCREENSHOT = Path(__file__).parent / "data/phone_screenshot_1080x2400.png"
RNG = np.random.default_rng(0)


def _png(image: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", **kw)
    return buf.getvalue()


def _random(mode: str, w: int = 37, h: int = 23) -> Image.Image:
    return Image.fromarray(RNG.integers(0, 256, (h, w, len(mode)), dtype=np.uint8), mode)


def _png_16bit_rgb(w: int = 9, h: int = 5) -> bytes:
    """An RGB PNG of 16 bits a sample, which Pillow opens as mode "RGB" too."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    samples = RNG.integers(0, 65536, (h, w * 3), dtype=np.uint16).astype(">u2").tobytes()
    stride = w * 6
    raw = b"".join(b"\0" + samples[y * stride:(y + 1) * stride] for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _pillow_pixels(data: bytes) -> np.ndarray:
    return rgb_pixels(Image.open(io.BytesIO(data))).numpy()


def _loaded(data: bytes) -> np.ndarray:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return MediaLoader().load(url).pixels.numpy()


def _opaque_rgba() -> Image.Image:
    image = _random("RGBA")
    image.putalpha(255)
    return image


def _gamma_chunk() -> PngImagePlugin.PngInfo:
    info = PngImagePlugin.PngInfo()
    info.add(b"gAMA", (45455).to_bytes(4, "big"))      # neither decoder applies it
    return info


@pytest.mark.parametrize("name,data", [
    ("rgb", _png(_random("RGB"))),
    ("rgb with a gAMA chunk", _png(_random("RGB"), pnginfo=_gamma_chunk())),
    ("opaque rgba (adb screencap's kind)", _png(_opaque_rgba())),
    ("the sample screenshot", SCREENSHOT.read_bytes()),
])
def test_fast_path_gives_pillows_pixels(name, data):
    fast = spng_rgb_pixels(Image.open(io.BytesIO(data)), data)
    assert fast is not None, f"{name}: not taken"
    want = _pillow_pixels(data)
    assert fast.dtype == torch.uint8 and fast.shape == want.shape
    assert np.array_equal(fast.numpy(), want)
    assert np.array_equal(_loaded(data), want)


def _translucent() -> Image.Image:
    image = _random("RGBA")
    image.putpixel((3, 4), (10, 20, 30, 128))
    return image


def _one_pixel_nearly_opaque() -> Image.Image:
    """Opaque but one white pixel of alpha 254: the largest pixel word short of opaque."""
    image = _opaque_rgba()
    image.putpixel((36, 22), (255, 255, 255, 254))
    return image


def _animated() -> bytes:
    buf = io.BytesIO()
    first, second = _random("RGB"), _random("RGB")
    first.save(buf, format="PNG", save_all=True, append_images=[second])
    return buf.getvalue()


@pytest.mark.parametrize("name,data", [
    ("translucent rgba", _png(_translucent())),
    ("rgba, one pixel of alpha 254", _png(_one_pixel_nearly_opaque())),
    ("rgb with a colour key", _png(_random("RGB"), transparency=(1, 2, 3))),
    ("palette", _png(_random("RGB").convert("P"))),
    ("grey", _png(Image.fromarray(RNG.integers(0, 256, (23, 37), dtype=np.uint8), "L"))),
    ("16-bit rgb", _png_16bit_rgb()),
    ("animated", _animated()),
])
def test_other_pngs_are_left_to_pillow(name, data):
    assert spng_rgb_pixels(Image.open(io.BytesIO(data)), data) is None, name
    assert np.array_equal(_loaded(data), _pillow_pixels(data))


def test_translucent_pixels_are_composited_over_white():
    image = Image.new("RGBA", (4, 4), (10, 20, 30, 255))
    image.putpixel((0, 0), (10, 20, 30, 0))
    pixels = _loaded(_png(image))
    assert pixels[0, 0].tolist() == [255, 255, 255] and pixels[1, 1].tolist() == [10, 20, 30]


@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_corrupt_fast_path_pngs_are_refused(mode):
    data = _png(_random(mode, 200, 100) if mode == "RGB" else _opaque_rgba().resize((200, 100)))
    for bad in (data[: len(data) // 2], data[:60]):
        with pytest.raises(MediaError, match="corrupt or truncated"):
            _loaded(bad)

"""PNGs decoded by multimodal/png_decode.py (libdeflate and the C unfilter, or libspng) give
Pillow's pixels, and every PNG the fast path does not take still follows Pillow's rules through
the media loader."""
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
from autoglm_serve.multimodal import png_decode
from autoglm_serve.multimodal.png_decode import fast_rgb_pixels

SCREENSHOT = Path(__file__).parent / "data/phone_screenshot_1080x2400.png"
RNG = np.random.default_rng(0)


def _png(image: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", **kw)
    return buf.getvalue()


def _random(mode: str, w: int = 37, h: int = 23) -> Image.Image:
    return Image.fromarray(RNG.integers(0, 256, (h, w, len(mode)), dtype=np.uint8), mode)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png_by_hand(w: int, h: int, depth: int, color: int, raw: bytes, interlace: int = 0,
                 idat_size: int = 1 << 30) -> bytes:
    """A PNG of the given scanlines (filter bytes included), its zlib stream cut into IDAT
    chunks of idat_size bytes."""
    z = zlib.compress(raw)
    idat = b"".join(_chunk(b"IDAT", z[i:i + idat_size]) for i in range(0, len(z), idat_size))
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, 0, 0,
                                                               interlace))
            + idat + _chunk(b"IEND", b""))


def _png_16bit_rgb(w: int = 9, h: int = 5) -> bytes:
    """An RGB PNG of 16 bits a sample, which Pillow opens as mode "RGB" too."""
    samples = RNG.integers(0, 65536, (h, w * 3), dtype=np.uint16).astype(">u2").tobytes()
    stride = w * 6
    raw = b"".join(b"\0" + samples[y * stride:(y + 1) * stride] for y in range(h))
    return _png_by_hand(w, h, 16, 2, raw)


def _filtered(pixels: np.ndarray, filters: list[int]) -> bytes:
    """PNG scanlines of (H, W, C) uint8 pixels, row y filtered by filters[y % len(filters)]
    (0 none, 1 sub, 2 up, 3 average, 4 paeth; the PNG specification's definitions)."""
    h, w, bpp = pixels.shape
    rows = pixels.reshape(h, w * bpp).astype(np.int32)
    out = []
    for y in range(h):
        x = rows[y]
        up = rows[y - 1] if y else np.zeros_like(x)
        left = np.concatenate([np.zeros(bpp, np.int32), x[:-bpp]])
        up_left = np.concatenate([np.zeros(bpp, np.int32), up[:-bpp]])
        f = filters[y % len(filters)]
        if f == 4:
            p = left + up - up_left
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, up_left))
        else:
            pred = [np.zeros_like(x), left, up, (left + up) // 2][f]
        out.append(bytes([f]) + ((x - pred) % 256).astype(np.uint8).tobytes())
    return b"".join(out)


def _adam7(pixels: np.ndarray) -> bytes:
    """Interlaced scanlines (Adam7's seven passes, no filter) of (H, W, C) pixels."""
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
              (0, 1, 1, 2)]
    return b"".join(b"\0" + row.tobytes() for x0, y0, dx, dy in passes
                    for row in pixels[y0::dy, x0::dx] if row.size)


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
    fast = fast_rgb_pixels(Image.open(io.BytesIO(data)), data)
    assert fast is not None, f"{name}: not taken"
    want = _pillow_pixels(data)
    assert fast.dtype == torch.uint8 and fast.shape == want.shape
    assert np.array_equal(fast.numpy(), want)
    assert np.array_equal(_loaded(data), want)


def _translucent() -> Image.Image:
    image = _random("RGBA")
    image.putpixel((3, 4), (10, 20, 30, 128))
    return image


def _one_pixel_nearly_opaque(x: int, y: int) -> Image.Image:
    """Opaque but one white pixel of alpha 254: the largest pixel word short of opaque."""
    image = _opaque_rgba()
    image.putpixel((x, y), (255, 255, 255, 254))
    return image


def _animated() -> bytes:
    buf = io.BytesIO()
    first, second = _random("RGB"), _random("RGB")
    first.save(buf, format="PNG", save_all=True, append_images=[second])
    return buf.getvalue()


@pytest.mark.parametrize("name,data", [
    ("translucent rgba", _png(_translucent())),
    # in a row's last pixels and near its first
    ("rgba, one pixel of alpha 254", _png(_one_pixel_nearly_opaque(36, 22))),
    ("rgba, one pixel of alpha 254 near the start", _png(_one_pixel_nearly_opaque(5, 3))),
    ("rgb with a colour key", _png(_random("RGB"), transparency=(1, 2, 3))),
    ("palette", _png(_random("RGB").convert("P"))),
    ("grey", _png(Image.fromarray(RNG.integers(0, 256, (23, 37), dtype=np.uint8), "L"))),
    ("16-bit rgb", _png_16bit_rgb()),
    ("animated", _animated()),
])
def test_other_pngs_are_left_to_pillow(name, data):
    assert fast_rgb_pixels(Image.open(io.BytesIO(data)), data) is None, name
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


def _native_decoder_or_skip():
    if png_decode.native_decoder() is None:
        pytest.skip("no C compiler or no deflate package: the libspng path decodes")


@pytest.mark.parametrize("width", [37, 1, 2])
@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_every_row_filter_decodes_to_pillows_pixels(mode, width):
    _native_decoder_or_skip()
    pixels = RNG.integers(0, 256, (29, width, len(mode)), dtype=np.uint8)
    if mode == "RGBA":
        pixels[..., 3] = 255
    # each filter after each other one, the image data over many IDAT chunks
    data = _png_by_hand(width, 29, 8, 2 if mode == "RGB" else 6,
                        _filtered(pixels, [0, 1, 2, 3, 4, 4, 3, 2, 1, 0, 2, 4, 1, 3]),
                        idat_size=97)
    rgba = mode == "RGBA"
    native, opaque = png_decode._native_rgb_pixels(data, rgba)
    assert opaque
    assert np.array_equal(native.numpy(), pixels[..., :3])
    assert np.array_equal(native.numpy(), _pillow_pixels(data))
    assert np.array_equal(png_decode._spng_rgb_pixels(data, rgba)[0].numpy(), pixels[..., :3])
    assert np.array_equal(_loaded(data), pixels[..., :3])


def test_open_autoglms_screenshot_takes_the_native_path():
    _native_decoder_or_skip()
    from autoglm_serve.bench.screenshots import screenshot_png_base64
    data = base64.b64decode(screenshot_png_base64(0, 0, 0))      # RGBA, Pillow's default level
    native, opaque = png_decode._native_rgb_pixels(data, rgba=True)
    assert opaque and np.array_equal(native.numpy(), _pillow_pixels(data))


def test_interlaced_pngs_decode_by_libspng():
    pixels = RNG.integers(0, 256, (19, 13, 3), dtype=np.uint8)
    data = _png_by_hand(13, 19, 8, 2, _adam7(pixels), interlace=1)
    assert np.array_equal(_pillow_pixels(data), pixels)
    assert np.array_equal(_loaded(data), pixels)


def _rgb_8x8(bad: str) -> tuple[bytes, np.ndarray]:
    pixels = RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    raw = _filtered(pixels, [1])
    if bad == "filter type 5":
        raw = raw[:3 * 25] + b"\x05" + raw[3 * 25 + 1:]    # row 3 of 25-byte rows
    elif bad == "scanlines a byte short":
        raw = raw[:-1]
    elif bad == "scanlines a byte long":
        raw = raw + b"\0"
    data = _png_by_hand(8, 8, 8, 2, raw)
    return (data[:-12] if bad == "no IEND" else data), pixels


@pytest.mark.parametrize("bad", ["filter type 5", "scanlines a byte short"])
def test_broken_scanlines_are_corrupt(bad):
    data, _ = _rgb_8x8(bad)
    with pytest.raises(MediaError, match="corrupt or truncated"):
        _loaded(data)


@pytest.mark.parametrize("odd", ["no IEND", "scanlines a byte long"])
def test_pngs_the_native_path_declines_go_to_libspng(odd):
    _native_decoder_or_skip()
    data, pixels = _rgb_8x8(odd)
    assert png_decode._native_rgb_pixels(data, rgba=False) is None
    assert np.array_equal(_loaded(data), pixels)


def test_random_scanlines_decode_as_pillow_does_or_are_refused():
    """Random sizes, random filtered bytes (so any filter's output), now and then a filter
    type PNG does not define: the native path gives Pillow's pixels or declines."""
    _native_decoder_or_skip()
    rng = np.random.default_rng(7)
    for trial in range(60):
        rgba = bool(trial % 2)
        bpp = 4 if rgba else 3
        w, h = int(rng.integers(1, 41)), int(rng.integers(1, 13))
        rows = rng.integers(0, 256, (h, 1 + w * bpp), dtype=np.uint8)
        rows[:, 0] = rng.integers(0, 5, h)
        bad = trial % 7 == 0
        if bad:
            rows[int(rng.integers(0, h)), 0] = int(rng.integers(5, 256))
        data = _png_by_hand(w, h, 8, 6 if rgba else 2, rows.tobytes())
        native = png_decode._native_rgb_pixels(data, rgba)
        if bad:
            assert native is None, trial
            continue
        image = Image.open(io.BytesIO(data))
        image.load()
        want = np.asarray(image)
        pixels, opaque = native
        assert np.array_equal(pixels.numpy(), want[..., :3]), trial
        assert opaque == (not rgba or bool((want[..., 3] == 255).all())), trial

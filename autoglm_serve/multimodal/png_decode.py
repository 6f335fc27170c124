"""Phone screenshots' PNGs decoded fast, instead of by Pillow.

A phone agent sends a 1080x2400 PNG every step and the server decodes it before the engine
sees the request, so the decode is part of each step's time to first token. Open-AutoGLM sends
what Android's screencap writes (RGBA), saved again at Pillow's default zlib level. Most of a
decode is the inflate: the stock zlib inside Pillow and pyspng copies that level's short-distance
matches a byte at a time. So the image data is inflated by libdeflate (the `deflate` package)
and its row filters undone by a C function built on this machine (kernels/cpu/png_unfilter.c):
3.5-12 ms here for the bench's screens in that form, against 26-35 ms with pyspng
(BENCHMARKS.md). Where either is missing (no C compiler, no AVX2), and for interlaced images, pyspng
(libspng) decodes; anything that path refuses goes to pyspng too, whose errors are the ones
answered.

Only 8-bit RGB PNGs and 8-bit RGBA PNGs whose every pixel is opaque come this way; they decode
to exactly Pillow's bytes. Palette, grey, 16-bit, colour-key transparency, translucent and
animated PNGs are left to Pillow (media.py), whose rules apply.
"""
from __future__ import annotations

import ctypes
import functools
import struct

import numpy as np
import pyspng
import torch
from PIL import Image

try:
    import deflate      # libdeflate
except ImportError:     # then pyspng decodes every PNG
    deflate = None

_SIGNATURE_AND_IHDR = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
_WIDTH_AND_HEIGHT = 16      # byte offsets in the file of the IHDR fields read here
_BIT_DEPTH = 24
_COLOR_TYPE = 25
_INTERLACE = 28
_FIRST_CHUNK = 33           # after the signature and IHDR
_RGB, _RGBA = 2, 6


class PngDecodeError(ValueError):
    """The data is corrupt or truncated; media.py answers it as Pillow's errors."""


def fast_rgb_pixels(header: Image.Image, data: bytes) -> torch.Tensor | None:
    """The (H, W, 3) uint8 pixels of ``data``, a PNG that Pillow has opened (header only) as
    ``header``; None when Pillow must decode this one."""
    if (header.format != "PNG" or header.mode not in ("RGB", "RGBA")
            or not data.startswith(_SIGNATURE_AND_IHDR) or data[_BIT_DEPTH] != 8
            or data[_COLOR_TYPE] not in (_RGB, _RGBA)
            or header.info.get("transparency") is not None
            or getattr(header, "n_frames", 1) != 1):
        return None
    rgba = data[_COLOR_TYPE] == _RGBA
    decoded = _native_rgb_pixels(data, rgba) if data[_INTERLACE] == 0 else None
    if decoded is None:
        decoded = _spng_rgb_pixels(data, rgba)
    pixels, opaque = decoded
    return pixels if opaque else None   # translucent: composited over white by Pillow's rule


def _native_rgb_pixels(data: bytes, rgba: bool) -> tuple[torch.Tensor, bool] | None:
    """(pixels, every pixel opaque) by libdeflate and png_unfilter.c; None where they are not
    here or do not take this PNG."""
    native = native_decoder()
    if native is None:
        return None
    inflate, unfilter = native
    width, height = struct.unpack_from(">II", data, _WIDTH_AND_HEIGHT)
    bpp = 4 if rgba else 3
    compressed = _image_data(data)
    if compressed is None:
        return None
    size = height * (1 + width * bpp)
    try:
        scanlines = inflate(compressed, size)     # at most size bytes
    except (deflate.DeflateError, MemoryError):
        return None
    if len(scanlines) != size:
        return None
    pixels = torch.empty((height, width, 3), dtype=torch.uint8)
    rows = np.empty(2 * width * bpp, dtype=np.uint8)
    min_alpha = unfilter(np.frombuffer(scanlines, dtype=np.uint8).ctypes.data, height, width, bpp,
                         pixels.data_ptr(), rows.ctypes.data)
    if min_alpha < 0:
        return None
    return pixels, min_alpha == 255


def _image_data(data: bytes) -> bytes | None:
    """The IDAT chunks' bytes joined, or None where the chunks do not parse (the CRCs are not
    checked: the zlib stream's own checksum covers the image data, and Pillow has read the
    header's chunks)."""
    parts, at = [], _FIRST_CHUNK
    while at + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        if at + 12 + length > len(data):
            return None
        if kind == b"IDAT":
            parts.append(data[at + 8: at + 8 + length])
        elif kind == b"IEND":
            return b"".join(parts) if parts else None
        at += 12 + length
    return None


@functools.cache
def native_decoder():
    """(inflate, unfilter) where libdeflate's package and a C compiler are here, else None;
    built once a machine (kernels/cpu/build.py), at the media loader's start."""
    if deflate is None:
        return None
    from autoglm_serve.kernels.cpu import build
    library = build.load("png_unfilter")
    if library is None:
        return None
    unfilter = library.png_unfilter_rgb
    unfilter.restype = ctypes.c_int
    unfilter.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                         ctypes.c_void_p, ctypes.c_void_p]
    return deflate.zlib_decompress, unfilter


def _spng_rgb_pixels(data: bytes, rgba: bool) -> tuple[torch.Tensor, bool]:
    try:
        pixels = pyspng.load(data, format="RGBA" if rgba else "RGB")
    except RuntimeError as exc:
        raise PngDecodeError(str(exc)) from None
    if not rgba:
        return torch.from_numpy(pixels), True
    # alpha is the high byte of each pixel read as a little-endian uint32: one reduction
    # over contiguous words, 0.15 ms here against 1.7 for pixels[..., 3] == 255
    if pixels.view("<u4").min() < 0xFF000000:
        return torch.from_numpy(pixels), False
    return torch.from_numpy(_without_alpha(pixels)), True


def _without_alpha(rgba: np.ndarray) -> np.ndarray:
    """(H, W, 3) copy of an (H, W, 4) array, a channel at a time: NumPy copies a 3-byte
    innermost run of a strided view a pixel at a time (18 ms for a 1080x2400 screenshot
    here), a whole channel's strided run in one loop (2.6 ms)."""
    rgb = np.empty(rgba.shape[:2] + (3,), dtype=rgba.dtype)
    for channel in range(3):
        rgb[..., channel] = rgba[..., channel]
    return rgb

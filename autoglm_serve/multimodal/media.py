"""OpenAI ``image_url`` -> decoded RGB PIL image, safely.

Accepted sources:
  * ``data:image/{png,jpeg,webp};base64,...`` always;
  * ``file://`` only under ``MediaPolicy.local_media_dir`` (realpath'd, so ``..`` and symlinks
    cannot lead outside it); off when no directory is set;
  * ``http(s)://`` only for hosts in ``MediaPolicy.allowed_domains`` (exact host match; empty =
    off, the default); redirects are followed by hand so every hop is checked.
Limits: encoded bytes (before base64 decoding / while downloading) and decoded pixels (read from
the header before the pixel data is decoded, so a decompression bomb never expands).
Every refusal raises ``MediaError`` (a ValueError) whose message is meant for the API user; the
server maps it to HTTP 400.

Blocking (file and network I/O, decoding): call it from a worker thread in async code.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import unquote, urljoin, urlsplit

import torch
from PIL import Image, UnidentifiedImageError

from autoglm_serve.multimodal.image_processor import rgb_pixels
from autoglm_serve.multimodal.png_decode import fast_rgb_pixels, native_decoder

ALLOWED_FORMATS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}
_DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|webp);base64,", re.IGNORECASE)


class MediaError(ValueError):
    """An image the server will not accept; the message is shown to the API user."""


@dataclass
class MediaPolicy:
    local_media_dir: str | None = None              # file:// root; None = file:// refused
    allowed_domains: tuple[str, ...] = ()           # http(s) hosts; empty = http refused
    max_encoded_bytes: int = 20 * 1024 * 1024       # compressed payload
    max_pixels: int = 40_000_000                    # decoded width*height (a 4K screenshot is 8.3M)
    http_timeout_s: float = 10.0
    max_redirects: int = 3
    allowed_formats: frozenset[str] = field(default_factory=lambda: frozenset(ALLOWED_FORMATS))


# sha256 drops the GIL: a screenshot's pixels (7.8 MB, ~5 ms) hash on a worker thread while the
# front-end tokenizes the prompt and expands its placeholders, and the next image decodes
_HASHERS = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                              thread_name_prefix="image-hash")


@dataclass
class LoadedImage:
    pixels: torch.Tensor    # the RGB bytes, (H, W, 3) uint8: the ones hashed, the ones the engine gets
    source: str             # "data", "file", "http" or "pil"
    _hash: Future = field(repr=False)     # of pixels_content_hash(pixels)

    @property
    def content_hash(self) -> str:
        """sha256 hex of size + RGB bytes: same pixels => same key, whatever the encoding
        (waits for the worker thread hashing them)."""
        return self._hash.result()

    @classmethod
    def of(cls, image: Image.Image, source: str) -> "LoadedImage":
        """``image``'s RGB pixels (transparency over white) and their hash."""
        return cls.of_pixels(rgb_pixels(image), source)

    @classmethod
    def of_pixels(cls, pixels: torch.Tensor, source: str) -> "LoadedImage":
        """The pixels, their hash begun on a worker thread."""
        return cls(pixels, source, _HASHERS.submit(pixels_content_hash, pixels))


def pixels_content_hash(pixels: torch.Tensor) -> str:
    """Key for the prefix cache and the encoder cache: identical pixels give identical keys."""
    height, width = pixels.shape[:2]
    h = hashlib.sha256(f"{width}x{height}:".encode())
    h.update(pixels.numpy())    # the tensor's own buffer: no copy (hashlib drops the GIL meanwhile)
    return h.hexdigest()


def image_content_hash(image: Image.Image) -> str:
    """The content hash of a PIL image's RGB pixels (``to_rgb``)."""
    return pixels_content_hash(rgb_pixels(image))


def _load_decoders(formats) -> None:
    """PIL imports its format plugins at the first Image.open, all of them (~77 ms on a CI core)
    where a format asked for is not among the five it loads first (~20 ms), and the PNG
    decoder's C part is compiled at its first use: at start-up here, not in the first request's
    time to first token."""
    Image.preinit()
    if any(f not in Image.OPEN for f in formats):
        Image.init()
    if "PNG" in formats:
        native_decoder()    # built at a machine's first start, not in its first screenshot


class MediaLoader:
    def __init__(self, policy: MediaPolicy | None = None):
        self.policy = policy or MediaPolicy()
        # PIL's own bomb guard is the second line (it warns above MAX_IMAGE_PIXELS, raises above
        # twice that; _decode turns the warning into an error). It is process-global, so we only
        # re-enable it if someone disabled it and raise it if it would refuse what we allow; our
        # header check enforces the policy's own limit.
        if Image.MAX_IMAGE_PIXELS is None or Image.MAX_IMAGE_PIXELS < self.policy.max_pixels:
            Image.MAX_IMAGE_PIXELS = self.policy.max_pixels
        _load_decoders(self.policy.allowed_formats)
        self._root = os.path.realpath(self.policy.local_media_dir) if self.policy.local_media_dir else None

    # ---- entry point ----
    def load(self, url: str) -> LoadedImage:
        if not isinstance(url, str) or not url:
            raise MediaError("image_url.url must be a non-empty string")
        if url[:5].lower() == "data:":
            data, source = self._from_data_url(url), "data"
        else:
            scheme = urlsplit(url).scheme.lower()
            if scheme == "file":
                data, source = self._from_file(url), "file"
            elif scheme in ("http", "https"):
                data, source = self._from_http(url), "http"
            else:
                raise MediaError("image_url must be a data:image/...;base64 URL"
                                 + (", a file:// URL" if self._root else "")
                                 + (", or an http(s) URL of an allowed domain" if self.policy.allowed_domains else ""))
        return LoadedImage.of_pixels(self._decode(data), source)

    # ---- sources ----
    def _from_data_url(self, url: str) -> bytes:
        match = _DATA_URL.match(url)
        if not match:
            raise MediaError("data URLs must look like data:image/png|jpeg|webp;base64,<data>")
        payload = url[match.end():]
        if len(payload) * 3 // 4 > self.policy.max_encoded_bytes:
            raise MediaError(f"image is larger than the {self.policy.max_encoded_bytes} byte limit")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise MediaError("image data URL is not valid base64") from None

    def _from_file(self, url: str) -> bytes:
        if self._root is None:
            raise MediaError("file:// image URLs are disabled on this server")
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise MediaError("file:// image URLs must not name a host")
        path = os.path.realpath(unquote(parts.path))
        if os.path.commonpath([path, self._root]) != self._root:
            raise MediaError("file:// image URL is outside the allowed media directory")
        try:
            if not os.path.isfile(path):
                raise MediaError("file:// image URL does not name an existing file")
            if os.path.getsize(path) > self.policy.max_encoded_bytes:
                raise MediaError(f"image is larger than the {self.policy.max_encoded_bytes} byte limit")
            with open(path, "rb") as f:
                return f.read(self.policy.max_encoded_bytes + 1)
        except OSError:
            raise MediaError("file:// image could not be read") from None

    def _check_host(self, url: str) -> None:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower().rstrip(".")
        allowed = {d.lower().rstrip(".") for d in self.policy.allowed_domains}
        if parts.scheme.lower() not in ("http", "https") or not host:
            raise MediaError("image URL redirected to something other than http(s)")
        if host not in allowed:
            if not allowed:
                raise MediaError("http(s) image URLs are disabled on this server; send the image as a data: URL")
            raise MediaError(f"image host {host!r} is not in the allowed media domains")

    def _from_http(self, url: str) -> bytes:
        import httpx

        cap = self.policy.max_encoded_bytes
        self._check_host(url)
        try:
            with httpx.Client(timeout=self.policy.http_timeout_s, follow_redirects=False, trust_env=False) as client:
                for _ in range(self.policy.max_redirects + 1):
                    with client.stream("GET", url) as response:
                        if response.is_redirect:
                            url = urljoin(url, response.headers.get("location", ""))
                            self._check_host(url)
                            continue
                        if response.status_code != 200:
                            raise MediaError(f"fetching the image failed with HTTP {response.status_code}")
                        declared = response.headers.get("content-length")
                        if declared is not None and declared.isdigit() and int(declared) > cap:
                            raise MediaError(f"image is larger than the {cap} byte limit")
                        chunks, size = [], 0
                        for chunk in response.iter_bytes():
                            size += len(chunk)
                            if size > cap:
                                raise MediaError(f"image is larger than the {cap} byte limit")
                            chunks.append(chunk)
                        return b"".join(chunks)
                raise MediaError("image URL redirected too many times")
        except httpx.TimeoutException:
            raise MediaError("fetching the image timed out") from None
        except httpx.HTTPError as exc:
            raise MediaError(f"fetching the image failed ({type(exc).__name__})") from None

    # ---- decoding ----
    def _decode(self, data: bytes) -> torch.Tensor:
        """The image's RGB pixels, (H, W, 3) uint8, transparency composited over white."""
        if len(data) > self.policy.max_encoded_bytes:
            raise MediaError(f"image is larger than the {self.policy.max_encoded_bytes} byte limit")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data), formats=list(self.policy.allowed_formats))
                # header only so far: refuse before the pixel data is expanded
                width, height = image.size
                if width <= 0 or height <= 0:
                    raise MediaError("image has no pixels")
                if width * height > self.policy.max_pixels:
                    raise MediaError(f"image is {width}x{height}; at most {self.policy.max_pixels} pixels are accepted")
                pixels = fast_rgb_pixels(image, data)     # a phone screenshot's PNG
                if pixels is not None:
                    return pixels
                image.seek(0)           # animated PNG/WebP: the first frame
                image.load()
        except MediaError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise MediaError(f"image has more than {self.policy.max_pixels} pixels") from None
        except UnidentifiedImageError:
            raise MediaError("image data is not a PNG, JPEG or WebP image") from None
        except (OSError, SyntaxError, ValueError, EOFError):   # PngDecodeError too
            raise MediaError("image data is corrupt or truncated") from None
        return rgb_pixels(image)     # the image processor's rule: transparency over white

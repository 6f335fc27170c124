"""image_url loading: data/file/http sources, their allow-lists, size and pixel limits, bad payloads."""
from __future__ import annotations

import base64
import hashlib
import http.server
import io
import os
import threading
import zlib
import struct
from pathlib import Path

import pytest
import torch
from PIL import Image

from autoglm_serve.multimodal.media import MediaError, MediaLoader, MediaPolicy, image_content_hash

SCREENSHOT = Path(__file__).parent / "data/phone_screenshot_1080x2400.png"


def _encode(image: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _gradient(w: int = 64, h: int = 48) -> Image.Image:
    return Image.frombytes("RGB", (w, h), bytes((x * 3 + y * 5 + c * 70) % 256
                                                for y in range(h) for x in range(w) for c in range(3)))


# ---- data: URLs ----

@pytest.mark.parametrize("fmt,mime", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_data_url_formats(fmt, mime):
    image = _gradient()
    loaded = MediaLoader().load(_data_url(_encode(image, fmt), mime))
    assert loaded.pixels.shape == (image.height, image.width, 3) and loaded.source == "data"
    if fmt == "PNG":
        assert loaded.pixels.numpy().tobytes() == image.tobytes()


def test_screenshot_loads_and_hash_depends_on_pixels_not_encoding():
    data = SCREENSHOT.read_bytes()
    loaded = MediaLoader().load(_data_url(data))
    assert loaded.pixels.shape == (2400, 1080, 3)
    # same pixels re-encoded (lossless WebP) -> same hash; one pixel changed -> different hash
    image = Image.fromarray(loaded.pixels.numpy())
    webp = _encode(image, "WEBP", lossless=True)
    assert MediaLoader().load(_data_url(webp, "image/webp")).content_hash == loaded.content_hash
    changed = image.copy()
    changed.putpixel((0, 0), (1, 2, 3) if changed.getpixel((0, 0)) != (1, 2, 3) else (4, 5, 6))
    assert image_content_hash(changed) != loaded.content_hash
    # same bytes, different shape -> different hash
    flat = Image.frombytes("RGB", (2400, 1080), image.tobytes())
    assert image_content_hash(flat) != loaded.content_hash


def test_hash_is_sha256_of_size_and_rgb_bytes_and_those_bytes_are_the_pixels():
    loaded = MediaLoader().load(_data_url(SCREENSHOT.read_bytes()))
    rgb = Image.open(SCREENSHOT).convert("RGB").tobytes()     # Pillow's decoding
    assert loaded.content_hash == hashlib.sha256(b"1080x2400:" + rgb).hexdigest()
    assert loaded.pixels.dtype == torch.uint8 and loaded.pixels.shape == (2400, 1080, 3)
    assert loaded.pixels.numpy().tobytes() == rgb


def test_rgba_is_composited_on_white():
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    loaded = MediaLoader().load(_data_url(_encode(rgba)))
    assert loaded.pixels[0, 0].tolist() == [255, 255, 255]


@pytest.mark.parametrize("url", [
    "data:image/gif;base64,R0lGODlhAQABAAAAACw=",
    "data:text/plain;base64,aGVsbG8=",
    "data:image/png,rawbytes",
    "data:image/png;base64,@@@not-base64@@@",
    "data:image/png;base64," + base64.b64encode(b"this is not an image").decode(),
    "ftp://example.com/a.png",
    "just some text",
    "",
])
def test_bad_data_and_schemes_are_refused(url):
    with pytest.raises(MediaError):
        MediaLoader().load(url)


def test_mime_lies_and_corruption_are_refused():
    gif = _encode(_gradient(), "GIF")
    with pytest.raises(MediaError, match="not a PNG, JPEG or WebP"):
        MediaLoader().load(_data_url(gif))                      # GIF bytes labelled image/png
    png = _encode(_gradient())
    with pytest.raises(MediaError, match="corrupt or truncated"):
        MediaLoader().load(_data_url(png[: len(png) // 2]))


def test_encoded_size_limit():
    data = _encode(_gradient(200, 200))
    with pytest.raises(MediaError, match="byte limit"):
        MediaLoader(MediaPolicy(max_encoded_bytes=len(data) - 10)).load(_data_url(data))
    assert MediaLoader(MediaPolicy(max_encoded_bytes=len(data) + 10)).load(_data_url(data))


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims a huge size; the pixel data is a few bytes (a bomb's first step)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_decompression_bomb_refused_from_header():
    with pytest.raises(MediaError, match="pixels"):
        MediaLoader(MediaPolicy(max_pixels=1_000_000)).load(_data_url(_png_header_only(30000, 30000)))
    # a real image just over the pixel limit is refused too
    with pytest.raises(MediaError, match="pixels"):
        MediaLoader(MediaPolicy(max_pixels=64 * 48 - 1)).load(_data_url(_encode(_gradient())))
    # PIL's global guard stays on and never refuses what a policy allows
    saved = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = None
        MediaLoader(MediaPolicy(max_pixels=1_000))
        assert Image.MAX_IMAGE_PIXELS == 1_000
        MediaLoader(MediaPolicy(max_pixels=50_000))
        assert Image.MAX_IMAGE_PIXELS == 50_000
        MediaLoader(MediaPolicy(max_pixels=2_000))
        assert Image.MAX_IMAGE_PIXELS == 50_000
    finally:
        Image.MAX_IMAGE_PIXELS = saved


# ---- file:// ----

def test_file_urls_only_inside_the_media_dir(tmp_path):
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "secret.png"
    outside.write_bytes(_encode(_gradient()))
    (root / "sub" / "ok.png").write_bytes(_encode(_gradient()))
    os.symlink(outside, root / "link.png")

    loader = MediaLoader(MediaPolicy(local_media_dir=str(root)))
    assert loader.load(f"file://{root}/sub/ok.png").source == "file"
    assert loader.load(f"file://{root}/sub/../sub/ok.png").pixels.shape == (48, 64, 3)
    with pytest.raises(MediaError, match="outside"):
        loader.load(f"file://{root}/../secret.png")            # .. escape
    with pytest.raises(MediaError, match="outside"):
        loader.load(f"file://{root}/link.png")                 # symlink escape
    with pytest.raises(MediaError, match="outside"):
        loader.load(f"file://{tmp_path}/media-evil/x.png")     # prefix trick
    with pytest.raises(MediaError, match="existing file"):
        loader.load(f"file://{root}/missing.png")
    with pytest.raises(MediaError, match="existing file"):
        loader.load(f"file://{root}/sub")
    with pytest.raises(MediaError, match="host"):
        loader.load(f"file://evil.example{root}/sub/ok.png")
    with pytest.raises(MediaError, match="disabled"):
        MediaLoader().load(f"file://{root}/sub/ok.png")        # no media dir configured


# ---- http(s):// ----

class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, dict, bytes]] = {}

    def do_GET(self):
        status, headers, body = self.routes.get(self.path, (404, {}, b"nope"))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    png = _encode(_gradient())
    port = srv.server_address[1]
    _Handler.routes = {
        "/img.png": (200, {"Content-Type": "image/png"}, png),
        "/big.png": (200, {}, _encode(Image.frombytes("RGB", (100, 100), os.urandom(30_000)))),
        "/redirect-ok": (302, {"Location": "/img.png"}, b""),
        "/redirect-away": (302, {"Location": "http://evil.example/img.png"}, b""),
        "/loop": (302, {"Location": "/loop"}, b""),
        "/text": (200, {"Content-Type": "text/html"}, b"<html>hi</html>"),
    }
    yield f"http://127.0.0.1:{port}"
    srv.shutdown()
    srv.server_close()


def test_http_off_by_default(server):
    with pytest.raises(MediaError, match="disabled"):
        MediaLoader().load(server + "/img.png")


def test_http_allowed_host(server):
    loader = MediaLoader(MediaPolicy(allowed_domains=("127.0.0.1",)))
    loaded = loader.load(server + "/img.png")
    assert loaded.source == "http" and loaded.pixels.shape == (48, 64, 3)
    assert loader.load(server + "/redirect-ok").pixels.shape == (48, 64, 3)
    with pytest.raises(MediaError, match="not in the allowed"):
        loader.load(server + "/redirect-away")
    with pytest.raises(MediaError, match="too many"):
        loader.load(server + "/loop")
    with pytest.raises(MediaError, match="HTTP 404"):
        loader.load(server + "/missing")
    with pytest.raises(MediaError, match="not a PNG"):
        loader.load(server + "/text")


def test_http_denied_host_and_byte_cap(server):
    with pytest.raises(MediaError, match="not in the allowed"):
        MediaLoader(MediaPolicy(allowed_domains=("example.com",))).load(server + "/img.png")
    capped = MediaLoader(MediaPolicy(allowed_domains=("127.0.0.1",), max_encoded_bytes=5_000))
    with pytest.raises(MediaError, match="byte limit"):
        capped.load(server + "/big.png")


def test_http_timeout():
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)                     # accepts the connection, never answers
    try:
        port = listener.getsockname()[1]
        loader = MediaLoader(MediaPolicy(allowed_domains=("127.0.0.1",), http_timeout_s=0.3))
        with pytest.raises(MediaError, match="timed out"):
            loader.load(f"http://127.0.0.1:{port}/img.png")
    finally:
        listener.close()


def test_media_error_is_a_value_error():
    assert issubclass(MediaError, ValueError)


def test_decoders_load_with_the_loader_not_the_first_image():
    """PIL imports its format plugins at the first Image.open (up to ~77 ms, all of them, where
    an allowed format is not among the five it loads first): a fresh process has every allowed
    format's decoder once the server's loader exists, before any request."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from PIL import Image\n"
            "from autoglm_serve.multimodal.media import ALLOWED_FORMATS, MediaLoader\n"
            "missing = lambda: [f for f in ALLOWED_FORMATS if f not in Image.OPEN]\n"
            "assert missing(), 'PIL loaded its plugins on import: nothing to show'\n"
            "MediaLoader()\n"
            "sys.exit(1 if missing() else 0)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr

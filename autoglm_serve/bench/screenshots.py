"""Synthetic 1080×2400 phone screenshots for the phone-agent workload, generated locally.

They only need to cost the server what a real screenshot costs (same resolution, so the same
number of vision patches, and a PNG of a realistic size to send and decode) and to differ from
step to step so that no encoder or prefix cache can reuse one. Each is a deterministic function
of (seed, agent, step).
"""

from __future__ import annotations

import base64
import io
import random

import numpy as np
from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 1080, 2400

_APPS = ["Phone", "Messages", "Camera", "Photos", "Maps", "Mail", "Music", "Clock", "Weather",
         "Settings", "Store", "Notes", "Calendar", "Files", "Wallet", "Video", "Taxi", "Food",
         "Bank", "Chat", "Shop", "News", "Health", "Books"]
_ITEMS = ["Wi-Fi", "Bluetooth", "Battery", "Display", "Sound", "Privacy", "Apps", "Storage",
          "Order #{n}", "Coffee x{n}", "Ride to gate {n}", "Invoice {n}", "Meeting at {n}:00",
          "Flight CA{n}", "Dinner for {n}", "Package {n} shipped"]
_SCREENS = ("home", "list", "chat", "detail")


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType: fixed-size bitmap font
        return ImageFont.load_default()


def _photo(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    """A smooth random 'photo': low-resolution noise upscaled, so it compresses like a picture."""
    small = rng.integers(0, 256, size=(max(1, h // 60), max(1, w // 60), 3), dtype=np.uint8)
    return Image.fromarray(small, "RGB").resize((w, h), Image.BILINEAR)


def render_screenshot(seed: int, agent: int, step: int) -> Image.Image:
    """One screen of a made-up app; the screen kind and content vary with every step."""
    rnd = random.Random(f"{seed}/{agent}/{step}")
    nrng = np.random.default_rng(rnd.getrandbits(32))
    bg = tuple(rnd.randint(225, 255) for _ in range(3))
    img = Image.new("RGB", (WIDTH, HEIGHT), bg)
    draw = ImageDraw.Draw(img)
    small, medium, large = _font(34), _font(44), _font(64)

    # Status bar with a clock that changes per step.
    draw.rectangle([0, 0, WIDTH, 90], fill=(20, 20, 20))
    draw.text((40, 22), f"{9 + step // 60:02d}:{step % 60:02d}", font=small, fill="white")
    draw.text((WIDTH - 220, 22), f"5G  {100 - step % 90}%", font=small, fill="white")

    kind = _SCREENS[(agent + step + rnd.randint(0, 3)) % len(_SCREENS)]
    accent = tuple(rnd.randint(0, 200) for _ in range(3))
    draw.rectangle([0, 90, WIDTH, 260], fill=accent)
    draw.text((50, 140), f"{rnd.choice(_APPS)} - agent {agent} step {step}", font=large,
              fill="white")

    if kind == "home":
        apps = rnd.sample(_APPS, 20)
        for i, name in enumerate(apps):
            x, y = 60 + (i % 4) * 250, 340 + (i // 4) * 330
            color = tuple(rnd.randint(30, 230) for _ in range(3))
            draw.rounded_rectangle([x, y, x + 180, y + 180], radius=40, fill=color)
            draw.text((x + 10, y + 200), name, font=small, fill=(40, 40, 40))
    elif kind == "list":
        for i in range(12):
            y = 300 + i * 170
            label = rnd.choice(_ITEMS).format(n=rnd.randint(1, 99))
            draw.rectangle([40, y, WIDTH - 40, y + 150], outline=(200, 200, 200), width=3)
            draw.ellipse([70, y + 30, 160, y + 120], fill=accent)
            draw.text((200, y + 45), label, font=medium, fill=(30, 30, 30))
    elif kind == "chat":
        y = 300
        while y < HEIGHT - 400:
            mine = rnd.random() < 0.5
            w, h = rnd.randint(400, 800), rnd.randint(110, 260)
            x0 = WIDTH - 40 - w if mine else 40
            draw.rounded_rectangle([x0, y, x0 + w, y + h], radius=30,
                                   fill=(150, 220, 150) if mine else (255, 255, 255))
            draw.text((x0 + 30, y + 30), rnd.choice(_ITEMS).format(n=rnd.randint(1, 99)),
                      font=medium, fill=(20, 20, 20))
            y += h + 40
        draw.rectangle([0, HEIGHT - 300, WIDTH, HEIGHT - 160], fill=(245, 245, 245))
    else:
        img.paste(_photo(nrng, WIDTH - 80, 900), (40, 300))
        for i in range(6):
            draw.text((60, 1260 + i * 110), rnd.choice(_ITEMS).format(n=rnd.randint(1, 99)),
                      font=medium, fill=(30, 30, 30))
        draw.rounded_rectangle([60, 1950, WIDTH - 60, 2100], radius=75, fill=accent)
        draw.text((WIDTH // 2 - 120, 1990), "Confirm", font=large, fill="white")

    # Navigation bar.
    draw.rectangle([0, HEIGHT - 140, WIDTH, HEIGHT], fill=(235, 235, 235))
    draw.rounded_rectangle([WIDTH // 2 - 150, HEIGHT - 60, WIDTH // 2 + 150, HEIGHT - 45],
                           radius=8, fill=(60, 60, 60))
    return img


def screenshot_png_base64(seed: int, agent: int, step: int) -> str:
    """PNG bytes of the screenshot, base64-encoded, as an image_url data URL carries them, in
    the form Open-AutoGLM sends: Android's screencap writes RGBA, and Open-AutoGLM saves what it
    pulled again with Pillow's default zlib level (6). The server inflates such a PNG several
    times slower than one saved at level 1, the bench's level until 2026-12-05 (BENCHMARKS.md)."""
    buf = io.BytesIO()
    render_screenshot(seed, agent, step).convert("RGBA").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")

"""The server's image load (multimodal/media.MediaLoader.load: base64, header, decode) of phone
screenshots, median ms of --repeats, on this machine's CPU, one thread:

    python3 scripts/image_load_bench.py [--repeats 21] [--screens 3] [PNG ...]

For each of the bench's first --screens screens (bench/screenshots.py): as Open-AutoGLM sends
it (RGBA, Pillow's default zlib level) and as RGB at level 1 (the bench's form before
2026-12-05); then each PNG file given. Prints one JSON line with the load average, so that a
CPU figure carries it. Run it from two trees (PYTHONPATH) to compare decoders.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from autoglm_serve.bench.screenshots import render_screenshot  # noqa: E402
from autoglm_serve.multimodal.media import MediaLoader  # noqa: E402


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def png_of(image, **save_args) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", **save_args)
    return buf.getvalue()


def median_ms(loader: MediaLoader, url: str, repeats: int) -> float:
    loader.load(url)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loader.load(url)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--screens", type=int, default=3)
    p.add_argument("pngs", nargs="*")
    args = p.parse_args()
    torch.set_num_threads(1)
    loader = MediaLoader()
    cases = {}
    for step in range(args.screens):
        screen = render_screenshot(0, 0, step)
        cases[f"screen {step}, Open-AutoGLM's form"] = png_of(screen.convert("RGBA"))
        cases[f"screen {step}, RGB level 1"] = png_of(screen, compress_level=1)
    for path in args.pngs:
        with open(path, "rb") as f:
            cases[os.path.basename(path)] = f.read()
    figures = {name: {"bytes": len(png), "ms": median_ms(loader, data_url(png), args.repeats)}
               for name, png in cases.items()}
    print(json.dumps({"image_load": figures, "repeats": args.repeats,
                      "load_average": [round(v, 2) for v in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()

"""CUDA's lazy loading of GEMM kernels at AutoGLM-Phone-9B's shapes: what a first call costs (GPU).

    python3 scripts/gpu/lazy_gemm_probe.py [--images 40] [--vision-sweep-steps 0,64,256]

With lazy module loading (CUDA's default), the first launch of each cuBLAS kernel loads its
module: up to ~140 ms of the host's time on an H100 (forty-first session, decoder shapes). The
engine's warm-up sweeps the decoder's linears at every row count up to 2,048
(engine/core/linear_warm_up.py); the vision tower's are not swept, and its row counts are an
image's patches (up to ~25,500 at max_pixels 5,000,000), so a chat client's first image of a
new size may meet loads the phone agents' warmed screenshot did not. For each --vision-sweep-
steps value, in a fresh process: optionally a sweep of the tower's linears at every multiple of
that step up to the largest patch count of 400 random image sizes (timed: what it would add to
the start), then F.linear at every tower shape for --images random image sizes (a first pass,
a second pass at the same sizes, then other sizes), each call's time over the same call
repeated ("extra": the load). Step 0 is the engine as it is. Prints one markdown row a pass.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "autoglm_serve", "models", "configs", "autoglm-phone-9b",
                      "config.json")


def vision_shapes() -> list[tuple[int, int, bool, int]]:
    """(in, out, bias, patches per row) of every distinct linear of the tower and merger."""
    with open(CONFIG) as f:
        vc = json.load(f)["vision_config"]
    h, out, inter, merge = (vc["hidden_size"], vc["out_hidden_size"], vc["intermediate_size"],
                            vc["spatial_merge_size"])
    patch_dim = vc["in_channels"] * vc["temporal_patch_size"] * vc["patch_size"] ** 2
    m2 = merge * merge
    return [(patch_dim, h, True, 1), (h, 3 * h, vc["attention_bias"], 1), (h, h, False, 1),
            (h, 2 * out, False, 1), (out, h, False, 1),                # a block (MLP is out wide)
            (m2 * h, out, True, m2), (out, out, False, m2),            # downsample, merger proj
            (out, 2 * inter, False, m2), (inter, out, False, m2)]      # merger MLP


def patch_counts(n: int, seed: int, max_pixels: int = 5_000_000) -> list[int]:
    """Patches of n random image sizes, resized as the processor does (28-pixel multiples
    under max_pixels)."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        w, h = rng.randint(200, 2600), rng.randint(200, 2600)
        scale = min(1.0, (max_pixels / (w * h)) ** 0.5)
        w, h = max(28, round(w * scale / 28) * 28), max(28, round(h * scale / 28) * 28)
        out.append((w // 14) * (h // 14))
    return out


def child(step: int, images: int) -> None:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    shapes = vision_shapes()
    weights = [(torch.randn(o, i, dtype=torch.bfloat16, device="cuda") * 0.02,
                torch.zeros(o, dtype=torch.bfloat16, device="cuda") if b else None)
               for i, o, b, _ in shapes]

    def run(rows_list: list[int], label: str) -> None:
        slow, worst, total = 0, 0.0, 0.0
        for rows in rows_list:
            for (i, _, _, per_row), (w, bias) in zip(shapes, weights):
                x = torch.zeros(max(1, rows // per_row), i, dtype=torch.bfloat16, device="cuda")
                torch.cuda.synchronize()
                t = time.perf_counter()
                F.linear(x, w, bias)
                torch.cuda.synchronize()
                first = time.perf_counter() - t
                t = time.perf_counter()
                F.linear(x, w, bias)
                torch.cuda.synchronize()
                extra = (first - (time.perf_counter() - t)) * 1e3
                total += max(extra, 0.0)
                worst = max(worst, extra)
                slow += extra > 1.0
        print(f"| {step or '-'} | {label} | {len(rows_list) * len(shapes)} | {slow} | "
              f"{worst:.1f} | {total:.0f} |", flush=True)

    sizes = patch_counts(images, seed=0)
    if step:
        top = max(patch_counts(400, seed=1) + sizes)
        t = time.perf_counter()
        run(list(range(step, top + step, step)), f"the sweep, rows every {step} to {top}")
        print(f"| {step} | (the sweep took {time.perf_counter() - t:.1f} s) | | | | |",
              flush=True)
    run(sizes, "first pass" if not step else "first pass after the sweep")
    run(sizes, "second pass, same sizes")
    run(patch_counts(images, seed=7), "other sizes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=40)
    ap.add_argument("--vision-sweep-steps", default="0,64,256")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.images)
        return
    print("| sweep step | pass | calls | extra > 1 ms | max extra ms | extra in all ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for step in (int(s) for s in args.vision_sweep_steps.split(",")):
        subprocess.run([sys.executable, __file__, "--child", str(step),
                        "--images", str(args.images)], check=False)


if __name__ == "__main__":
    main()

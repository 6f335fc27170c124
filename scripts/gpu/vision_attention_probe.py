"""The vision tower's attention at image sizes seen before and new: cuDNN against flash (GPU).

    python3 scripts/gpu/vision_attention_probe.py [--images 12] [--repeats 3]

The tower (models/glm4v_vision.py) runs SDPA over each image's patches, non-causal, 12 heads of
128, in the layout its fused qkv leaves ([N, 3, heads, 128] unbound and transposed). cuDNN
builds an execution plan for every new shape (the fifth session measured 56-588 ms for new key
counts at the decoder's heads); the engine's warm-up builds one for a 1080x2400 screenshot at
the server's max_pixels, so a phone agent meets none, but a chat client's image of another
size does, every time its size is new. For each backend, in a fresh process: one call at each
of --images random image sizes (as the processor resizes them under max_pixels 5,000,000),
synchronised and timed alone, then the same sizes again (--repeats, the median): the first
call's extra time is the plan. Prints one markdown row a backend; the tower runs 24 such
calls an image, so "a screenshot's 24 calls" is what one image of 12,432 patches costs there.
Written for the forty-third session; not run there (no machine came).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lazy_gemm_probe import patch_counts  # noqa: E402

HEADS, HEAD_DIM, SCREENSHOT_PATCHES = 12, 128, 12_432


def child(backend_name: str, images: int, repeats: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def call(n: int) -> float:
        qkv = torch.randn(n, 3, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in qkv.unbind(1))
        torch.cuda.synchronize()
        start = time.perf_counter()
        with sdpa_kernel([backend]):
            F.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
        return 1e3 * (time.perf_counter() - start)

    call(256)                       # the library's own first-use cost, not a shape's
    sizes = patch_counts(images, seed=3)
    first = [call(n) for n in sizes]
    again = [statistics.median(call(n) for _ in range(repeats)) for n in sizes]
    extra = [f - a for f, a in zip(first, again)]
    shot_first = call(SCREENSHOT_PATCHES)
    shot = statistics.median(call(SCREENSHOT_PATCHES) for _ in range(repeats))
    print(f"| {backend_name} | {len(sizes)} ({min(sizes)}-{max(sizes)} patches) | "
          f"{statistics.median(extra):.1f} / {max(extra):.1f} | {sum(extra):.0f} | "
          f"{statistics.median(again):.2f} | {shot_first:.1f} / {shot:.2f} | {24 * shot:.1f} |",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", default="CUDNN_ATTENTION,FLASH_ATTENTION,EFFICIENT_ATTENTION")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.images, args.repeats)
        return
    print("| backend | new sizes | a new size's extra ms, median / max | extra in all ms | "
          "a call at a known size, median ms | 12,432 patches: first / again ms | "
          "a screenshot's 24 calls ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.backends.split(","):
        subprocess.run([sys.executable, __file__, "--child", name, "--images", str(args.images),
                        "--repeats", str(args.repeats)], check=False)


if __name__ == "__main__":
    main()

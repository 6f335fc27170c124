"""AutoGLM-Phone-9B's vision tower on one phone screenshot: where its time goes (GPU).

    python scripts/gpu/vit_bench.py [--screenshot PATH] [--max-pixels 5000000] [--profile]

Builds the packaged config's tower (random weights, bf16), preprocesses the screenshot with our
image processor, then times one forward (median of --runs after a warm-up):
- with the fused kernels (vision rotary, residual+RMSNorm, SiLU-and-mul) and without them;
- for each SDPA backend order (PyTorch's choice, flash, cuDNN, memory-efficient), the attention
  of one block alone at the screenshot's length, and the whole tower with that order;
- with --profile, the top CUDA kernels of one fused forward (torch.profiler).
The achieved TFLOP/s counts the linear layers and the attention (2 FLOPs a multiply-add).
Prints a markdown table last and writes JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autoglm_serve.kernels import fused_ops  # noqa: E402
from autoglm_serve.models import glm4v_vision  # noqa: E402
from autoglm_serve.models.glm4v_vision import Glm4vVisionTower  # noqa: E402
from autoglm_serve.multimodal.image_processor import Glm4vImageProcessor  # noqa: E402

CONFIG_DIR = os.path.join(ROOT, "autoglm_serve", "models", "configs", "autoglm-phone-9b")
SCREENSHOT = os.path.join(ROOT, "tests", "data", "phone_screenshot_1080x2400.png")
ORDERS = {
    "default": None,
    "flash": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
    "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION],
    "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION],
}


def timed(fn, runs: int) -> float:
    """Median wall time of fn() in ms, GPU synchronised, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def tower_flops(cfg, n: int) -> float:
    h, m = cfg.hidden_size, cfg.out_hidden_size
    per_block = 2 * n * (h * 3 * h + h * h + 3 * h * m) + 4 * n * n * h
    merged = n // cfg.spatial_merge_size ** 2
    tail = 2 * merged * (4 * h * m + m * m + 3 * m * cfg.intermediate_size)
    return cfg.depth * per_block + 2 * n * 1176 * h + tail


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--screenshot", default=SCREENSHOT)
    ap.add_argument("--max-pixels", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default="/tmp/vit_bench.json")
    args = ap.parse_args()

    from PIL import Image
    from transformers import AutoConfig
    vcfg = AutoConfig.from_pretrained(CONFIG_DIR).vision_config
    proc = Glm4vImageProcessor.from_pretrained(CONFIG_DIR, max_pixels=args.max_pixels)
    item = proc(Image.open(args.screenshot), device="cuda")
    grid = [item.grid_thw]
    n = item.pixel_values.shape[0]
    torch.manual_seed(0)
    tower = Glm4vVisionTower(vcfg).to(device="cuda", dtype=torch.bfloat16).eval()
    for p in tower.parameters():
        p.data.normal_(0, 0.02)
    pixels = item.pixel_values.to(torch.bfloat16)
    flops = tower_flops(vcfg, n)
    print(f"screenshot -> grid {item.grid_thw}, {n} patches, {item.num_tokens} image tokens; "
          f"{flops / 1e12:.1f} TFLOP per forward", flush=True)

    @torch.inference_mode()
    def forward():
        return tower(pixels, grid)

    rows, result = [], {"patches": n, "grid": list(item.grid_thw), "tflop": flops / 1e12}
    heads, hd = vcfg.num_heads, vcfg.hidden_size // vcfg.num_heads
    q, k, v = (torch.randn(1, heads, n, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    attn_flops = 4 * n * n * heads * hd
    for name, order in ORDERS.items():
        try:
            ctx = (lambda: sdpa_kernel(order, set_priority=True)) if order else None

            def attn():
                if ctx is None:
                    return F.scaled_dot_product_attention(q, k, v)
                with ctx():
                    return F.scaled_dot_product_attention(q, k, v)
            t_attn = timed(attn, args.runs)
            glm4v_vision.SDPA_BACKENDS = order
            t_tower = timed(forward, args.runs)
        except Exception as exc:  # a backend that does not run here
            print(f"{name}: {exc!r}", flush=True)
            continue
        finally:
            glm4v_vision.SDPA_BACKENDS = None
        result[f"attn_{name}_ms"], result[f"tower_{name}_ms"] = t_attn, t_tower
        rows.append(f"| SDPA {name} | {t_attn:.3f} ms ({attn_flops / t_attn / 1e9:.0f} TFLOP/s) | "
                    f"{t_tower:.1f} ms ({flops / t_tower / 1e9:.0f} TFLOP/s) |")
        print(rows[-1], flush=True)

    fused_ops.ENABLED = False
    t_plain = timed(forward, args.runs)
    fused_ops.ENABLED = True
    result["tower_unfused_default_ms"] = t_plain
    rows.append(f"| fused kernels off, SDPA default | | {t_plain:.1f} ms "
                f"({flops / t_plain / 1e9:.0f} TFLOP/s) |")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        forward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            forward()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18), flush=True)

    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n### ViT, {n} patches ({item.num_tokens} image tokens), bf16, "
          f"{torch.cuda.get_device_name()}\n")
    print("| variant | one block's attention | whole tower |\n| --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

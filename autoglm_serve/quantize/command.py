"""The `autoglm-serve quantize` subcommand."""
from __future__ import annotations

import argparse

from autoglm_serve.quantize.methods import DEFAULT_NUM_SAMPLES, FP8_METHODS, METHODS

_DTYPES = ("bfloat16", "float16", "float32")


def add_quantize_subcommand(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "quantize", help="write a W4A16 or FP8 compressed-tensors checkpoint (vLLM and transformers load it)",
        description="Quantize MODEL (default: the embedded SmolLM2-135M-Instruct) and write a "
                    "compressed-tensors checkpoint to --out. W4A16 (rtn, gptq, awq): int4 "
                    "weights in groups (symmetric, or with --zero-points), packed. FP8 (fp8, "
                    "gptq-fp8): float8 weights per output channel, activations per token at run "
                    "time. lm_head and a vision tower stay unquantized. Serve the result with "
                    "`autoglm-serve serve DIR --quantization compressed-tensors`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", nargs="?", default=None,
                   help="a local HF checkpoint directory or .gguf file (default: the embedded model)")
    p.add_argument("--method", choices=METHODS, default="gptq",
                   help="rtn: round to nearest, no calibration; gptq, awq: calibrated on the "
                        "built-in agent conversations; fp8: FP8 weights rounded to nearest + "
                        "dynamic per-token activations; gptq-fp8: the same format, its weights "
                        "chosen by GPTQ on the calibration set")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--group-size", type=int, default=None,
                   help="int4 weights per scale (default: 128, halved until it divides every layer width)")
    p.add_argument("--act-order", action="store_true",
                   help="gptq: quantize the most active input channels first (static groups, no g_idx)")
    p.add_argument("--zero-points", action="store_true",
                   help="int4 with an integer zero point per group (asymmetric, as llm-compressor's "
                        "W4A16_ASYM); transformers loads it with CompressedTensorsConfig(dequantize=True)")
    p.add_argument("--int8-targets", nargs="+", default=[], metavar="NAME",
                   help="int4 methods: Linear layers kept at 8 bits (int8 weights in the same "
                        "groups, W8A16), as llama.cpp's Q4_K_M keeps some tensors at 6 bits: "
                        "a module name or its last part (down_proj), or a re: pattern. "
                        "down_proj about halves what int4 costs SmolLM2's perplexity "
                        "(BENCHMARKS.md)")
    p.add_argument("--num-samples", type=int, default=DEFAULT_NUM_SAMPLES,
                   help="calibration samples (conversations and documents)")
    p.add_argument("--max-tokens", type=int, default=512, help="text tokens per calibration sample")
    p.add_argument("--dtype", choices=_DTYPES, default="bfloat16",
                   help="dtype of the unquantized tensors and scales in the checkpoint")
    p.add_argument("--device", default="cpu", help="where the algorithms run (cpu, cuda)")
    p.set_defaults(func=cmd_quantize)
    return p


def cmd_quantize(args: argparse.Namespace) -> int:
    import torch

    from autoglm_serve.quantize.pipeline import write_quantized_checkpoint

    if args.method in FP8_METHODS and (args.group_size is not None or args.act_order):
        raise SystemExit("--group-size and --act-order are for the int4 methods (rtn, gptq, awq)")
    if args.method in FP8_METHODS and args.zero_points:
        raise SystemExit("--zero-points is for the int4 methods (rtn, gptq, awq)")
    if args.act_order and args.method != "gptq":
        raise SystemExit("--act-order needs --method gptq")
    try:
        out = write_quantized_checkpoint(
            args.model, args.out, args.method, group_size=args.group_size, act_order=args.act_order,
            symmetric=not args.zero_points, num_samples=args.num_samples, max_tokens=args.max_tokens,
            dtype=getattr(torch, args.dtype), device=args.device, int8_targets=args.int8_targets)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"autoglm-serve quantize: {exc}") from exc
    print(f"wrote {args.method} checkpoint to {out}")
    return 0

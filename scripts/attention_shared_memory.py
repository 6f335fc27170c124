"""Shared memory of the paged attention kernels, compiled for a GPU without one (CPU).

    python3 scripts/attention_shared_memory.py [--arch 86,89,90]

AutoGLM-Phone-9B's attention (32 query heads, 2 KV heads, head_dim 128, bf16 cache, block 16):
the decode and prefill kernels compiled by triton.compile for each sm_ARCH (from sm_90 also the
prefill's TMA variant, for pages of 64 tokens), with the tiles and pipeline depth the launchers
pick and the launch's own specialization (16-byte aligned pointers, strides that are multiples
of 16, the block table's row stride left unspecialized). Prints one line per kernel and arch:
`sm_89 decode 39116 bytes`. A program that needs more shared memory than the card allows fails
at its first launch, so this is the check that the tiles tuned on an H200 (227 KB a program)
still run on the 24 GB cards our users have (sm_86 RTX 3090 / A10, sm_89 RTX 4090 / L4: 99 KB).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from autoglm_serve.kernels import paged_attention as pa  # noqa: E402
from autoglm_serve.kernels import paged_prefill as pp  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 2, 128, 16
INT_POINTERS = ("counters_ptr", "block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr")


def compile_for(kernel, constexprs: dict, arch: int, num_warps: int, num_stages: int):
    sig = {}
    constexprs = dict(constexprs)
    for name in kernel.arg_names:
        if name == "kv_desc":   # the TMA descriptor of the prefill's K/V boxes, or None
            if constexprs["TMA"]:
                sig[name] = f"tensordesc<bf16[{constexprs['BLOCK_N']},{HEAD_DIM}]>"
            else:
                constexprs[name] = None
                sig[name] = "constexpr"
        elif name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = ("*fp32" if name.startswith(("part_", "cos_", "sin_")) else
                         "*i64" if name == "slot_ptr" else
                         "*i32" if name in INT_POINTERS else "*bf16")
        elif name in ("scale_log2", "parts_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    unspecialized = set(kernel.do_not_specialize)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if sig[name].startswith("*")
             or (name.startswith("stride_") and name not in unspecialized)}
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def shared_memory(arch: int) -> dict[str, int]:
    """Bytes of shared memory each kernel needs on sm_<arch>, as the launchers configure it
    (decode at 16 rows, the phone agents' batch, and at one row, each writing its K/V with
    GLM's rotary as the engine's decode steps do)."""
    heads = (HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, torch.bfloat16, torch.bfloat16)
    out = {}
    for name, rows in (("decode", 16), ("decode-1-row", 1)):   # the two tiles decode_split picks
        decode = pa.decode_shape(*heads, pa.decode_split(rows, KV_HEADS, 132), None, True,
                                 HEAD_DIM // 4, True)
        out[name] = compile_for(pa._decode_kernel, dict(decode.constexprs, PDL=arch >= 90),
                                arch, decode.num_warps, decode.num_stages).metadata.shared
    prefill = pp.prefill_shape(*heads)
    out["prefill"] = compile_for(pp._prefill_kernel, prefill.constexprs, arch,
                                 prefill.num_warps, prefill.num_stages).metadata.shared
    if arch >= 90:   # TMA: the K/V tiles as boxes of pages of 64 tokens (--block-size 64)
        tma = pp.prefill_shape(HEADS, KV_HEADS, HEAD_DIM, 64, torch.bfloat16, torch.bfloat16,
                               pp.PREFILL_TMA_TILES, True)
        out["prefill-tma"] = compile_for(pp._prefill_kernel, tma.constexprs, arch,
                                         tma.num_warps, tma.num_stages).metadata.shared
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="86,89,90")
    args = ap.parse_args()
    for arch in (int(a) for a in args.arch.split(",")):
        for kernel, nbytes in shared_memory(arch).items():
            print(f"sm_{arch} {kernel} {nbytes} bytes", flush=True)


if __name__ == "__main__":
    main()

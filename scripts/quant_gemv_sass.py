"""Compiles the quantized decode GEMVs for sm_90 without a GPU and prints, per config, the
registers, spills, the instructions of the main loop per weight a thread handles and its
synchronisations (barriers, wgmma waits, fences): a way to compare configs and kernel changes
on a CPU-only machine (triton.compile with a GPUTarget, the ptxas and cuobjdump bundled with
Triton).

    python3 scripts/quant_gemv_sass.py w4 1,64,128,2,0,0 w4s 1,64,128,2,0,0 fp8 1,16,512,1,0,0

w4: W4A16 with zero points (AWQ, GPTQ); w4s: symmetric (compressed-tensors, the engine's
dummy W4A16); w8, w8s: the same for W8A16 (kernels/w8a16_gemv.py); fp8: W8A8.

Each config: BLOCK_M,BLOCK_N,BLOCK_K,SPLIT_K,dot,gated[,num_warps,num_stages] (BLOCK_M as
the launcher pads it: 16 for dot, else the rows rounded up to a power of two; num_warps 4 and
num_stages 3 unless given). dot 2 or 3: W4A16 on CUDA cores in bf16 pairs, one or two words a
sum (GemvConfig.packed 1 or 2); FP8 on CUDA cores in f16 pairs: dot 2, 3 or 4 for one, two or
four words a sum (packed 1, 2, 4).
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from autoglm_serve.kernels import fp8_gemv, w4a16_gemv, w8a16_gemv  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_kernel(kind: str, bm, bn, bk, split, dot, gated, warps=4, stages=3):
    packed, dot = {2: 1, 3: 2, 4: 4}.get(dot, 0), dot == 1
    if kind in ("w4", "w4s"):
        fn = w4a16_gemv._w4a16_gemv_kernel
        # bf16 activations: CUDA cores read them as int32 pairs, as the launcher passes them
        sig = {"x_ptr": "*bf16" if dot else "*i32", "qw_ptr": "*i32", "s_ptr": "*bf16",
               "z_ptr": "*u8", "bias_ptr": "*bf16", "y_ptr": "*bf16", "partial_ptr": "*fp32",
               "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "x_stride": "i32",
               "words": "i32", "groups": "i32", "even_exp": "i32", "odd_exp": "i32"}
        consts = dict(GROUP=128, HAS_ZEROS=kind == "w4", X_PAIRS=0 if dot else 1,
                      PACKED=packed)
    elif kind in ("w8", "w8s"):
        fn = w8a16_gemv._w8a16_gemv_kernel
        sig = {"x_ptr": "*bf16" if dot else "*i32", "qw_ptr": "*i32", "s_ptr": "*bf16",
               "z_ptr": "*u8", "bias_ptr": "*bf16", "y_ptr": "*bf16", "partial_ptr": "*fp32",
               "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "x_stride": "i32",
               "words": "i32", "groups": "i32", "byte_exp": "i32"}
        consts = dict(GROUP=128, HAS_ZEROS=kind == "w8", X_PAIRS=0 if dot else 1)
    else:
        fn = fp8_gemv._fp8_gemv_kernel
        sig = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "bias_ptr": "*bf16",
               "y_ptr": "*bf16", "partial_ptr": "*fp32", "count_ptr": "*i32", "amax_ptr": "*fp32",
               "xp_ptr": "*i32", "wp_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
        # the amax pass's chunk as the launcher picks it at K = 4096 (qkv, gate_up, o_proj)
        consts = {"HAS_AMAX": False, "AMAX_BLOCK": fp8_gemv.amax_block(
            4096, fp8_gemv.GemvConfig(bn, bk, split, warps, stages, bool(dot))),
            "PACKED": packed, "X_F16": False}
    consts.update(HAS_BIAS=False, GATED=gated, USE_DOT=dot, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                  SPLIT_K=split, EVEN_K=True, NUM_STAGES=stages, PDL=True)
    consts["COMPILED"] = True
    sig.update({c: "constexpr" for c in consts})
    names = list(sig)
    # what the launcher's specialization gives: 16-aligned pointers, sizes divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or n in ("N", "K", "x_stride", "words")}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def disassemble(kernel) -> tuple[str, str]:
    """(resource usage, SASS) of a compiled kernel, by the cuobjdump bundled with Triton."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
    return usage, sass


def loop_mix(sass: str) -> collections.Counter:
    """Opcodes of the longest backward branch's body (the pipelined K loop)."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(4)))
    best = None
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < addr:
            span = (addr - int(target.group(1), 16), int(target.group(1), 16), addr)
            best = max(best or span, span)
    if best is None:
        return collections.Counter()
    return collections.Counter(op.split(".")[0] for a, op, _ in ins if best[1] <= a <= best[2])


def main():
    args = sys.argv[1:]
    if len(args) < 2 or len(args) % 2:
        sys.exit(__doc__)
    for kind, spec in zip(args[::2], args[1::2]):
        bm, bn, bk, split, dot, gated, *launch = (int(v) for v in spec.split(","))
        warps, stages = launch + [4, 3][len(launch):]
        kernel = compile_kernel(kind, bm, bn, bk, split, dot, bool(gated), warps, stages)
        usage, sass = disassemble(kernel)
        regs = re.search(r"REG:(\d+)", usage)
        spills = re.search(r"LOCAL:(\d+)", usage)
        mix = loop_mix(sass)
        weights = bn * bk * (2 if gated else 1) / (32 * warps)     # per thread
        print(f"{kind} {spec}: {regs and regs.group(1)} registers, {spills and spills.group(1)} "
              f"bytes local, loop {sum(mix.values())} instructions = "
              f"{sum(mix.values()) / weights:.1f} per weight; {mix.most_common(12)}; barriers "
              f"{mix['BAR']}, warpgroup syncs {mix['WARPGROUP']}, memory fences {mix['MEMBAR']}",
              flush=True)


if __name__ == "__main__":
    main()

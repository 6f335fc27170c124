"""Perplexity of `autoglm-serve quantize` variants on the embedded SmolLM2 (too long for CI:
several minutes on two cores). Prints one row per variant; transformers loads each checkpoint
(zero-point ones through CompressedTensorsConfig(dequantize=True)).

    PYTHONPATH=. python scripts/quantize_quality.py [--variants rtn:32:zp,gptq:32:ao:zp,fp8]

A variant is method[:group][:ao (act-order)][:zp (zero points)].
Measured 2026-12-01 (float32; unquantized 22.09), symmetric, 32 samples of the earlier
all-chat set: rtn:32 28.15 (+27%), gptq:32:ao 25.74 (+16%), gptq:64:ao 27.41 (+24%), gptq:64
28.67 (+30%), awq:32 27.12 (+23%). With zero points (scale and zero point searched together),
in memory: rtn:32:zp 24.23 (+9.7%), gptq:32:ao:zp 24.6-25.1 (+11-14%, 16-24 samples, with or
without documents in the set). fp8 22.42 (+1.5%). 2026-12-04, 16 samples: awq:32:zp 23.87
(+8.1%), awq:64:zp 27.26 (+23.4%); fp8 22.00 (-0.4%, the test's figure). GPTQ damped by each
input's own diagonal (gptq.py) since: gptq:32:ao:zp at 48 samples 22.58 (+2.2%) with 2 threads.
"""
from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch

TEXT = (Path(__file__).resolve().parent.parent / "tests" / "data" / "perplexity_prose.txt").read_text()


def main() -> None:
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    from autoglm_serve.quantize.perplexity import perplexity
    from autoglm_serve.quantize.pipeline import write_quantized_checkpoint
    from autoglm_serve.quantize.source_model import load_source_model

    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="rtn:64,rtn:32,gptq:64,gptq:64:ao,gptq:32:ao,awq:64,awq:32,fp8")
    p.add_argument("--num-samples", type=int, default=32)
    args = p.parse_args()
    source = load_source_model(None)
    ids = source.tokenizer(TEXT, return_tensors="pt").input_ids
    base = perplexity(source.model, ids)
    print(f"{'variant':<14} {'perplexity':>10} {'vs fp32':>8} {'seconds':>8}")
    print(f"{'unquantized':<14} {base:>10.2f} {'':>8} {'':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants.split(","):
            method, *rest = variant.split(":")
            group = int(rest[0]) if rest and rest[0].isdigit() else None
            start = time.time()
            out = write_quantized_checkpoint(copy.deepcopy(source), Path(tmp) / variant.replace(":", "_"),
                                             method, group_size=group, act_order="ao" in rest,
                                             symmetric="zp" not in rest,
                                             num_samples=args.num_samples, dtype=torch.float32)
            seconds = time.time() - start
            kw = {"quantization_config": CompressedTensorsConfig(dequantize=True)} if "zp" in rest else {}
            model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, **kw).eval()
            ppl = perplexity(model, ids)
            print(f"{variant:<14} {ppl:>10.2f} {100 * (ppl / base - 1):>+7.1f}% {seconds:>8.0f}", flush=True)


if __name__ == "__main__":
    main()

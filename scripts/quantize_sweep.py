"""GPTQ/AWQ/RTN settings on the embedded SmolLM2 in memory: perplexity without writing checkpoints.

    PYTHONPATH=. python scripts/quantize_sweep.py rtn gptq:n48:d0.1 gptq:n32 awq:n16 \
        [--held-out FILE ...] [--held-out-chars N]

quantize_quality.py writes each checkpoint and loads it in transformers (what the test does);
this writes the weights the checkpoint would hold (pipeline.quantize_linears) into a copy of
the model, int4 group 32 with zero points, act-order for GPTQ, and prints the perplexity on
tests/data/perplexity_prose.txt and on each --held-out text (its first --held-out-chars
characters, in windows of 1,024 tokens), each beside the unquantized model's. The prose is 351
tokens: held-out texts of several thousand tokens resolve differences of a point or two that it
does not. A variant is method[:nN samples][:dDAMP][:cPASSES][:plain] (cPASSES: the coordinate
descent's passes after GPTQ, c0 none; plain: GPTQ's own scales, not refit).
Two minutes a GPTQ variant at 16 samples on two cores, four at 48; AWQ six.
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch

TEXT = Path(__file__).resolve().parent.parent / "tests" / "data" / "perplexity_prose.txt"


def quantize_in_place(model, tokenizer, method: str, num_samples: int, damp: float,
                      descent_passes: int, refit: bool = True) -> None:
    """The checkpoint's weights (pipeline.quantize_linears), written into `model` itself."""
    from autoglm_serve.quantize.calibration import calibration_samples
    from autoglm_serve.quantize.methods import CALIBRATED_METHODS
    from autoglm_serve.quantize.pipeline import quantize_linears
    from autoglm_serve.quantize.schemes import ignored_modules, target_linears, weight_args

    targets = target_linears(model, ignored_modules(model))
    args = weight_args(method, 32, act_order=method == "gptq", symmetric=False)
    samples = calibration_samples(tokenizer, num_samples) if method in CALIBRATED_METHODS else []
    with torch.no_grad():
        quantized = quantize_linears(model, targets, method, args, torch.float32, samples,
                                     act_order=method == "gptq", damp=damp, refit=refit,
                                     descent_passes=descent_passes)
        for name, linear in targets.items():
            linear.weight.copy_(quantized[name].weight)


def main() -> None:
    from autoglm_serve.engine.core.cpu_threads import size_cpu_threads
    from autoglm_serve.quantize.gptq import DEFAULT_DAMP, DESCENT_PASSES
    from autoglm_serve.quantize.methods import DEFAULT_NUM_SAMPLES
    from autoglm_serve.quantize.perplexity import perplexity
    from autoglm_serve.quantize.source_model import load_source_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variants", nargs="+")
    p.add_argument("--held-out", nargs="*", default=[])
    p.add_argument("--held-out-chars", type=int, default=2500)
    args = p.parse_args()
    size_cpu_threads(torch.device("cpu"))
    source = load_source_model(None)
    texts = [TEXT.read_text()] + [Path(f).read_text()[:args.held_out_chars] for f in args.held_out]
    ids = [source.tokenizer(t, return_tensors="pt").input_ids for t in texts]
    base = [perplexity(source.model, i) for i in ids]
    names = ["prose"] + [Path(f).name for f in args.held_out]
    print("| variant | " + " | ".join(names) + " | seconds |")
    print("| --- |" + " --- |" * (len(names) + 1))
    print("| unquantized | " + " | ".join(f"{b:.2f}" for b in base) + " | |", flush=True)
    for variant in args.variants:
        method, *opts = variant.split(":")
        n = next((int(o[1:]) for o in opts if o.startswith("n")), DEFAULT_NUM_SAMPLES)
        damp = next((float(o[1:]) for o in opts if o.startswith("d")), DEFAULT_DAMP)
        start = time.time()
        model = copy.deepcopy(source.model).float()
        passes = next((int(o[1:]) for o in opts if o.startswith("c")), DESCENT_PASSES)
        quantize_in_place(model, source.tokenizer, method, n, damp, passes,
                          refit="plain" not in opts)
        ppls = [perplexity(model, i) for i in ids]
        cells = [f"{q:.2f} ({100 * (q / b - 1):+.1f}%)" for q, b in zip(ppls, base)]
        print(f"| {variant} | " + " | ".join(cells) + f" | {time.time() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()

"""Quality of `quantize` on the embedded SmolLM2-135M-Instruct (real weights): perplexity with
transformers loading each written checkpoint, on two fixed English texts, and greedy answers to
fixed questions. The texts: tests/data/perplexity_prose.txt (351 tokens), the issue's, and the
Apache License 2.0, this project's (tests/data/apache-2.0.txt, 2,224 tokens): six times as
long, and it ranks int4 variants as texts of 7,700-9,700 tokens do (BENCHMARKS.md), where the
prose moves by a point or two either way.

The source is the package's Q4_1 GGUF dequantized: every weight already sits on a 16-level grid
per 32 inputs, w = d*q + m with a float offset m, which no int4 grid with an integer zero point
(nor a symmetric one) can reproduce, nor FP8's; re-quantizing it costs what quantizing twice
costs. Measured by this test (1 thread, as CI runs it), prose / Apache-2.0, on the CPU machine
of 2026-12-06 (an Intel Xeon with AVX-512 and AMX), with torch's kernels for it and then held
to AVX2 (ATEN_CPU_CAPABILITY=avx2): unquantized 22.09 / 14.50 (both); RTN group 32 with zero
points +9.7% / +20.9% (both); GPTQ group 32 act-order with zero points, 48 samples, refit
scales, with its coordinate descent (gptq.py) +4.5% / +10.0% and +4.9% / +9.0%; FP8 (weights,
scales searched, and per-token activations) +1.5% / +4.0% and +0.9% / +4.7% (its weights alone
-0.3% on the prose); gptq-fp8 (the same format, weights by GPTQ) +1.2% / +4.0% and +1.7% /
+3.0%. The continuous paths (the unquantized model, RTN's dequantized weights) agree to every
digit across the kernels; FP8's per-token rounding of the activations, and any calibration,
turn the kernels' different float32 summation orders into different codes, so these figures
move by up to a point with the machine (earlier sessions' machines gave others again), and the
bounds below hold for both sets. Issue 12's 1% for FP8 is met only on the prose with AVX2's
kernels, its 3% for calibrated int4 on neither text. The same GPTQ with every down_proj at
8 bits (--int8-targets down_proj, 25% of the linears' weights) measured +2.4% / +3.1% on the
AVX-512 machine of 2026-12-07 (+2.2% and +3.8% on two held-out texts of ~10,000 tokens, where
int4 alone gave +6.7% and +5.5%; BENCHMARKS.md). Every variant keeps the greedy answer
"Paris".
"""
import copy
from pathlib import Path

import pytest
import torch

from tests.quantized_fixtures import decompressed_reference

pytest.importorskip("compressed_tensors")

TEXTS = {name: (Path(__file__).parent / "data" / file).read_text()
         for name, file in (("prose", "perplexity_prose.txt"), ("apache", "apache-2.0.txt"))}
# (the unquantized model itself answers "What is the capital of Italy?" wrongly)
QUESTIONS = [("What is the capital of France?", "Paris")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from autoglm_serve.quantize.pipeline import write_quantized_checkpoint
    from autoglm_serve.quantize.source_model import load_source_model

    source = load_source_model(None)
    base = tmp_path_factory.mktemp("smollm2")
    out = {"unquantized": source}
    # int4: the best variants, group 32 with zero points (GPTQ with act-order, default samples)
    gptq = dict(group_size=32, act_order=True, symmetric=False)
    options = {"rtn": ("rtn", dict(group_size=32, symmetric=False)), "gptq": ("gptq", gptq),
               "gptq-int8-down": ("gptq", dict(gptq, int8_targets=["down_proj"])),
               "fp8": ("fp8", {}), "gptq-fp8": ("gptq-fp8", {})}
    for name, (method, kw) in options.items():
        out[name] = write_quantized_checkpoint(copy.deepcopy(source), base / name, method,
                                               max_tokens=512, dtype=torch.float32, **kw)
    return out


def _load(checkpoints, name):
    from transformers import (AutoModelForCausalLM, AutoTokenizer, CompressedTensorsConfig,
                              LlamaForCausalLM)
    if name == "unquantized":
        return checkpoints[name].model, checkpoints[name].tokenizer
    path = checkpoints[name]
    if name == "gptq-int8-down":
        # two bit widths: transformers' dequantize-at-load path would read every Linear as the
        # first config group's (tests/quantized_fixtures.py)
        return decompressed_reference(path, LlamaForCausalLM), AutoTokenizer.from_pretrained(path)
    # zero points: transformers loads them through its dequantize-at-load path (README)
    kw = {} if "fp8" in name else {"quantization_config": CompressedTensorsConfig(dequantize=True)}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()
    return model, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def results(checkpoints):
    from autoglm_serve.quantize.perplexity import perplexity
    out = {}
    for name in ("unquantized", "rtn", "gptq", "gptq-int8-down", "fp8", "gptq-fp8"):
        model, tok = _load(checkpoints, name)
        ppl = {text: perplexity(model, tok(content, return_tensors="pt").input_ids)
               for text, content in TEXTS.items()}
        answers = []
        for question, _ in QUESTIONS:
            prompt = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
            p = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
            with torch.no_grad():
                gen = model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=16,
                                     do_sample=False, pad_token_id=tok.eos_token_id)
            answers.append(tok.decode(gen[0, p.shape[1]:], skip_special_tokens=True))
        out[name] = (ppl, answers)
        print(f"{name}: perplexity {ppl} answers {answers}")
    return out


def test_fp8_perplexity_bounded(results):
    base, fp8 = results["unquantized"][0], results["fp8"][0]
    assert fp8["prose"] <= base["prose"] * 1.02      # measured +1.5% and +0.9%; the issue asks 1%
    assert fp8["apache"] <= base["apache"] * 1.055   # measured +4.0% and +4.7%


def test_calibrated_fp8_perplexity_bounded(results):
    base, fp8, gptq = (results[name][0] for name in ("unquantized", "fp8", "gptq-fp8"))
    assert gptq["prose"] <= base["prose"] * 1.02     # measured +1.2% and +1.7%; the issue asks 1%
    assert gptq["apache"] <= base["apache"] * 1.045  # measured +4.0% and +3.0%
    # GPTQ's weights are no worse than rounding's: below on the two texts together
    assert gptq["prose"] * gptq["apache"] < fp8["prose"] * fp8["apache"]


def test_w4a16_perplexity_bounded(results):
    base, rtn, gptq = (results[name][0] for name in ("unquantized", "rtn", "gptq"))
    # int4 costs something: these are real int4 weights
    assert base["prose"] * 1.05 < rtn["prose"] <= base["prose"] * 1.11
    for text in TEXTS:
        assert gptq[text] < rtn[text]
    assert gptq["prose"] <= base["prose"] * 1.06     # measured +4.5% and +4.9%
    assert gptq["apache"] <= base["apache"] * 1.12   # +10.0% and +9.0%; without the descent +14.2%


def test_w4a16_with_int8_down_proj_halves_the_int4_cost(results):
    """--int8-targets down_proj: a quarter of the linears' weights at 8 bits."""
    base, gptq, mixed = (results[name][0] for name in ("unquantized", "gptq", "gptq-int8-down"))
    for text in TEXTS:
        assert mixed[text] - base[text] < (gptq[text] - base[text]) * 0.75
    assert mixed["prose"] <= base["prose"] * 1.035   # measured +2.4%; the issue asks 3%
    assert mixed["apache"] <= base["apache"] * 1.045  # measured +3.1%


@pytest.mark.parametrize("name", ["unquantized", "rtn", "gptq", "gptq-int8-down", "fp8",
                                  "gptq-fp8"])
def test_greedy_answers_still_right(results, name):
    for (question, expected), answer in zip(QUESTIONS, results[name][1]):
        assert expected in answer, (question, answer)

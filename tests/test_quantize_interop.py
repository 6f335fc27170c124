"""`autoglm-serve quantize`'s checkpoints in our engine: written from a tiny random GLM-4.1V
and from the embedded SmolLM2, loaded by our engine and by transformers (with the
compressed-tensors library), greedy tokens equal and logits within tolerance."""
import pytest
import torch

from autoglm_serve import LLM, SamplingParams
from tests.quantized_fixtures import decompressed_reference, make_tiny_quantized_glm4v
from tests.test_engine_oracle import hf_greedy_with_logits

STEPS = 8


def ours(path, prompts, **kw):
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="float32", block_size=16,
              num_kv_blocks=64, **kw)
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.core.runner.logits_hook = lambda reqs, logits: [
        seen.setdefault(r.request_id, []).append(logits[i].clone()) for i, r in enumerate(reqs)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))
    return [(o.outputs[0].token_ids, seen[o.request_id]) for o in outs]


def assert_close(engine_runs, reference, prompts, tol):
    for (tokens, logits), prompt in zip(engine_runs, prompts):
        ref_tokens, ref_logits = hf_greedy_with_logits(reference, prompt, STEPS)
        assert tokens == ref_tokens
        for step, (a, b) in enumerate(zip(logits, ref_logits)):
            rel = ((a - b.float()).norm() / b.float().norm()).item()
            assert rel < tol, f"step {step}: relative error {rel:.2e}"


@pytest.mark.parametrize("method,options", [
    ("rtn", {}), ("fp8", {}), ("gptq", {"symmetric": False}), ("gptq-fp8", {}),
    ("gptq", {"symmetric": False, "int8_targets": ["down_proj"]}),
    ("awq", {"int8_targets": ["re:.*layers\\.0\\.self_attn\\.[qkv]_proj$"]})])
def test_tiny_glm4v_checkpoint_matches_transformers(tmp_path, method, options):
    from transformers import CompressedTensorsConfig, Glm4vForConditionalGeneration
    _, quantized = make_tiny_quantized_glm4v(tmp_path, method, **options)
    prompts = [[5, 17, 33, 2, 9, 41, 7], list(range(10, 40))]
    # zero points: compressed-tensors 0.20 lays out the model transformers loads into with them
    # unpacked (its compress of a meta model skips packing them), so the plain load refuses the
    # packed ones the format stores; the dequantize-at-load path unpacks them as it should
    kw = {"quantization_config": CompressedTensorsConfig(dequantize=True)} \
        if options.get("symmetric") is False else {}
    if "int8_targets" in options:
        # two bit widths: that dequantize path reads every Linear as the first group's
        assert_int8_where_named(quantized, options["int8_targets"])
        reference = decompressed_reference(quantized, Glm4vForConditionalGeneration)
    else:
        reference = Glm4vForConditionalGeneration.from_pretrained(quantized, dtype=torch.float32,
                                                                  **kw).eval()
    assert_close(ours(quantized, prompts), reference, prompts, tol=1e-3)


def assert_int8_where_named(path, entries):
    """The named Linears are stored 4 codes an int32 (8 bits), the rest 8 (4 bits)."""
    import re

    from safetensors.torch import load_file
    tensors = {}
    for f in path.glob("*.safetensors"):
        tensors.update(load_file(f))
    bits = {name[:-len(".weight_packed")]: 32 * t.shape[1] // tensors[
        name.replace("weight_packed", "weight_shape")][1].item()
        for name, t in tensors.items() if name.endswith(".weight_packed")}
    named = {n for n in bits if any(re.match(e[3:], n) if e.startswith("re:") else
                                    n.endswith("." + e) for e in entries)}
    assert named and {bits[n] for n in named} == {8}
    assert {bits[n] for n in bits.keys() - named} == {4}


def test_smollm2_rtn_checkpoint_matches_transformers(tmp_path):
    from transformers import AutoModelForCausalLM
    from autoglm_serve.quantize.pipeline import write_quantized_checkpoint
    out = write_quantized_checkpoint(None, tmp_path / "smollm2-w4a16", "rtn", dtype=torch.float32)
    prompts = [[1, 504, 3458, 314, 4649, 30], [1, 1204, 564, 253, 5422, 28]]
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert_close(ours(out, prompts), hf, prompts, tol=1e-3)

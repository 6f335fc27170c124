"""GPTQ calibrates a decoder layer stage by stage ("true sequential"): the Linears that share one
input (q/k/v; gate/up, or GLM's fused gate_up) form a stage, and each stage's inputs are observed
with the stages before it already quantized, so it is fitted to what it will really be given."""
import copy

import pytest
import torch

from glm4v_fixtures import make_tiny_glm4v
from tiny_models import build_tiny_decoder

pytest.importorskip("compressed_tensors")

from autoglm_serve.quantize.calibration import CalibrationSample  # noqa: E402
from autoglm_serve.quantize.sequential import (calibrate_layer_by_layer,  # noqa: E402
                                               capture_first_layer_inputs, decoder_layers,
                                               input_stages)


def _samples(vocab: int, lengths=(9, 17, 12)) -> list[CalibrationSample]:
    g = torch.Generator().manual_seed(0)
    return [CalibrationSample(torch.randint(1, vocab - 1, (1, n), generator=g)) for n in lengths]


def _llama(tmp_path):
    from transformers import AutoModelForCausalLM
    path = build_tiny_decoder(tmp_path, "llama", hidden_size=128, intermediate_size=192)[0]
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", ["llama", "glm4v"])
def test_stages_are_the_linears_that_share_an_input_in_call_order(tmp_path, arch):
    if arch == "glm4v":
        from transformers import Glm4vForConditionalGeneration
        model = Glm4vForConditionalGeneration.from_pretrained(make_tiny_glm4v(tmp_path),
                                                              dtype=torch.float32).eval()
        mlp = [["mlp.gate_up_proj"], ["mlp.down_proj"]]
    else:
        model = _llama(tmp_path)
        mlp = [["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]
    seen = []

    def record(prefix, layer, run_layer):
        linears = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
        seen.append(input_stages(linears, run_layer))

    calibrate_layer_by_layer(model, _samples(model.config.get_text_config().vocab_size), record)
    attention = [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.o_proj"]]
    assert seen == [attention + mlp] * len(decoder_layers(model)[1])


@pytest.fixture
def one_thread():
    """Both paths sum in the same order, so their roundings agree bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_o_proj_is_calibrated_on_the_quantized_q_k_v(tmp_path, one_thread):
    """quantize_linears' o_proj equals GPTQ on the attention output of the already quantized
    q/k/v (computed here by hand), and differs from GPTQ on the unquantized layer's."""
    from autoglm_serve.quantize.gptq import HessianObserver, gptq_quantize
    from autoglm_serve.quantize.pipeline import quantize_linears
    from autoglm_serve.quantize.schemes import ignored_modules, target_linears, weight_args

    model = _llama(tmp_path)
    reference = copy.deepcopy(model)
    samples = _samples(model.config.vocab_size)
    args = weight_args("gptq", 32, act_order=True, symmetric=False)
    quantized = quantize_linears(model, target_linears(model, ignored_modules(model)), "gptq",
                                 args, torch.float32, samples, act_order=True)

    layer = decoder_layers(reference)[1][0]
    calls = capture_first_layer_inputs(reference, layer, samples)

    def gptq_on_observed(linear):
        observer = HessianObserver(linear)
        with torch.no_grad():
            for call in calls:
                layer(*call.args, **call.kwargs)
        observer.remove()
        return gptq_quantize(linear.weight, observer.hessian, observer.tokens, args,
                             torch.float32, act_order=True)

    attn = layer.self_attn
    o_on_unquantized = gptq_on_observed(attn.o_proj).weight
    for name in ("q_proj", "k_proj", "v_proj"):
        linear = getattr(attn, name)
        q = gptq_on_observed(linear).weight
        assert torch.equal(q, quantized[f"model.layers.0.self_attn.{name}"].weight)
        linear.weight.data.copy_(q)
    o_on_quantized = gptq_on_observed(attn.o_proj).weight

    ours = quantized["model.layers.0.self_attn.o_proj"].weight
    assert torch.equal(ours, o_on_quantized)
    assert not torch.equal(ours, o_on_unquantized)

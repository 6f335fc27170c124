"""`autoglm-serve quantize` on a tiny random GLM-4.1V: the checkpoint is compressed-tensors' layout,
keeps the vision tower and lm_head unquantized, and loads in transformers (with compressed-tensors)."""
import json

import pytest
import torch
from safetensors import safe_open

from glm4v_fixtures import make_tiny_glm4v
from quantized_fixtures import make_tiny_quantized_glm4v

pytest.importorskip("compressed_tensors")


def _tensors(path):
    with safe_open(path / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _logits(path, ids):
    from transformers import Glm4vForConditionalGeneration
    model = Glm4vForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits[0]


IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 42]])


@pytest.fixture(scope="module")
def gptq_dirs(tmp_path_factory):
    return make_tiny_quantized_glm4v(tmp_path_factory.mktemp("gptq"), "gptq", act_order=True)


def test_w4a16_layout_and_unquantized_parts(gptq_dirs):
    source, out = gptq_dirs
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    w = qc["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["strategy"], w["group_size"], w["symmetric"], w["actorder"]) == (4, "group", 128, True, "weight")
    assert qc["ignore"] == ["lm_head", "re:^model\\.visual\\..*", "re:^visual\\..*"]
    for name in ("preprocessor_config.json", "tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (out / name).is_file(), name

    src, got = _tensors(source), _tensors(out)
    language = [k[: -len(".weight")] for k in src if ".language_model." in k and k.endswith("proj.weight")]
    assert len(language) == 2 * 6          # q k v o gate_up down, 2 layers
    for base in language:
        assert base + ".weight" not in got
        assert got[base + ".weight_packed"].dtype == torch.int32
        assert got[base + ".weight_packed"].shape[1] * 8 == src[base + ".weight"].shape[1]
        assert got[base + ".weight_scale"].shape == (src[base + ".weight"].shape[0], src[base + ".weight"].shape[1] // 128)
    # the vision tower, the embedding and lm_head are written as they were
    kept = [k for k in src if k.startswith("model.visual.") or k.startswith("lm_head") or "embed_tokens" in k]
    assert any(k.startswith("model.visual.blocks.") for k in kept)
    for k in kept:
        assert torch.equal(got[k], src[k]), k


def test_w4a16_loads_in_transformers_on_the_int4_grid(gptq_dirs):
    from transformers import Glm4vForConditionalGeneration

    source, out = gptq_dirs
    model = Glm4vForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        quantized = model(IDS).logits[0]        # the first forward decompresses the weights
    scales = _tensors(out)
    q_proj = "model.language_model.layers.1.self_attn.q_proj"
    weight = model.get_submodule(q_proj).weight
    codes = weight / scales[q_proj + ".weight_scale"].repeat_interleave(128, dim=1)
    assert torch.allclose(codes, codes.round(), atol=1e-4)
    codes = codes.round()
    assert codes.min() >= -8 and codes.max() <= 7 and len(codes.unique()) > 8
    reference = _logits(source, IDS)
    assert not torch.allclose(quantized, reference)
    cos = torch.nn.functional.cosine_similarity(quantized.flatten(), reference.flatten(), dim=0)
    assert cos > 0.98


def test_fp8_dynamic_checkpoint(tmp_path):
    source, out = make_tiny_quantized_glm4v(tmp_path, "fp8")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "float-quantized"
    group = qc["config_groups"]["group_0"]
    assert (group["weights"]["type"], group["weights"]["strategy"]) == ("float", "channel")
    assert (group["input_activations"]["strategy"], group["input_activations"]["dynamic"]) == ("token", True)
    got = _tensors(out)
    down = "model.language_model.layers.0.mlp.down_proj"
    assert got[down + ".weight"].dtype == torch.float8_e4m3fn
    assert got[down + ".weight_scale"].shape == (got[down + ".weight"].shape[0], 1)
    assert got["model.visual.blocks.0.attn.qkv.weight"].dtype == torch.float32
    cos = torch.nn.functional.cosine_similarity(_logits(out, IDS).flatten(), _logits(source, IDS).flatten(), dim=0)
    assert cos > 0.995            # 3 mantissa bits on random weights; the real model: see the quality test


def test_cli_quantize_and_bad_group_size(tmp_path, capsys):
    from autoglm_serve.cli import main

    source = make_tiny_glm4v(tmp_path / "source")
    assert main(["quantize", str(source), "--method", "rtn", "--group-size", "64",
                 "--dtype", "bfloat16", "--out", str(tmp_path / "rtn")]) == 0
    assert "wrote rtn checkpoint" in capsys.readouterr().out
    got = _tensors(tmp_path / "rtn")
    assert got["model.language_model.layers.0.self_attn.o_proj.weight_scale"].shape == (128, 2)
    assert got["model.language_model.layers.0.self_attn.o_proj.weight_scale"].dtype == torch.bfloat16
    with pytest.raises(SystemExit, match="--group-size 96 does not divide"):
        main(["quantize", str(source), "--method", "rtn", "--group-size", "96", "--out", str(tmp_path / "bad")])
    with pytest.raises(SystemExit, match="--act-order needs --method gptq"):
        main(["quantize", str(source), "--method", "rtn", "--act-order", "--out", str(tmp_path / "bad")])
    with pytest.raises(SystemExit) as help_exit:
        main(["quantize", "--help"])
    assert help_exit.value.code == 0 and "--method {rtn,gptq,awq,fp8,gptq-fp8}" in capsys.readouterr().out


@pytest.mark.parametrize("arch", ["glm4v", "llama"])
def test_awq_scales_leave_the_unquantized_function_unchanged(tmp_path, arch):
    """Folding 1/s into the norm or the previous Linear undoes W*s exactly (before rounding):
    GLM-4.1V's fused gate_up, Llama's gate/up and, without GQA, v -> o."""
    from transformers import AutoModelForCausalLM, Glm4vForConditionalGeneration

    from autoglm_serve.quantize.awq import balance_groups, search_and_apply_scales
    from autoglm_serve.quantize.schemes import weight_args
    from autoglm_serve.quantize.sequential import decoder_layers
    from tiny_models import build_tiny_decoder

    if arch == "glm4v":
        model = Glm4vForConditionalGeneration.from_pretrained(make_tiny_glm4v(tmp_path), dtype=torch.float32)
        expected = 3
    else:
        model = AutoModelForCausalLM.from_pretrained(
            build_tiny_decoder(tmp_path, "llama", num_key_value_heads=4)[0], dtype=torch.float32)
        expected = 4
    model.eval()
    with torch.no_grad():
        before = model(IDS).logits
    torch.manual_seed(0)
    for layer in decoder_layers(model)[1]:
        groups = balance_groups(layer)
        assert len(groups) == expected
        for group in groups:
            x = torch.randn(64, group.linears[0].in_features).abs() * torch.rand(group.linears[0].in_features) * 4
            assert search_and_apply_scales(group, x, weight_args("awq", 32), torch.float32, alphas=[0.5]) == 0.5
    with torch.no_grad():
        after = model(IDS).logits
    assert torch.allclose(after, before, atol=1e-4, rtol=1e-4)


def test_awq_checkpoint_loads(tmp_path):
    source, out = make_tiny_quantized_glm4v(tmp_path, "awq")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "pack-quantized"
    cos = torch.nn.functional.cosine_similarity(_logits(out, IDS).flatten(), _logits(source, IDS).flatten(), dim=0)
    assert cos > 0.97             # random weights, random-ish activations: loose, it proves loading


def test_cli_int8_targets(tmp_path, capsys):
    """--int8-targets: a second config group at 8 bits for the named Linears, refused where it
    names none, splits q/k/v (one matmul when served) or comes with an FP8 method."""
    from autoglm_serve.cli import main

    source = make_tiny_glm4v(tmp_path / "source")
    out = tmp_path / "mixed"
    assert main(["quantize", str(source), "--method", "rtn", "--group-size", "32", "--out",
                 str(out), "--int8-targets", "down_proj", "re:.*layers\\.1\\.self_attn\\.o_proj$"]) == 0
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    assert groups["group_0"]["targets"] == ["Linear"] and groups["group_0"]["weights"]["num_bits"] == 4
    assert groups["group_1"]["weights"]["num_bits"] == 8
    got = _tensors(out)
    # 8-bit codes pack 4 to an int32, 4-bit ones 8
    assert got["model.language_model.layers.0.mlp.down_proj.weight_packed"].shape == (128, 256 // 4)
    assert got["model.language_model.layers.1.self_attn.o_proj.weight_packed"].shape == (128, 128 // 4)
    assert got["model.language_model.layers.0.self_attn.o_proj.weight_packed"].shape == (128, 128 // 8)
    for args, error in [(["--int8-targets", "mlp.up"], "names no quantized Linear"),
                        (["--int8-targets", "v_proj"], "name all of them or none"),
                        (["--method", "fp8", "--int8-targets", "down_proj"], "for the int4 methods")]:
        with pytest.raises(SystemExit, match=error):
            main(["quantize", str(source), "--out", str(tmp_path / "bad")] +
                 (args if "--method" in args else ["--method", "rtn"] + args))

"""`--hf-overrides` (vLLM's flag) onto the model's config: sub-configs updated key by key, other
keys replaced or added; through the engine, the built-in AutoGLM-Phone-9B config made tiny and
given a GPTQ quantization_config whose down_proj is 8-bit (random weights of that format)."""
import gc

import pytest
import torch
from transformers import AutoConfig

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.engine.core.model_setup import BUILTIN_CONFIGS
from autoglm_serve.loader.hf_overrides import apply_hf_overrides
from autoglm_serve.quantization.wna16 import WNA16LinearMethod

TINY = {"text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "num_key_value_heads": 1},
        "vision_config": {"depth": 1, "hidden_size": 64, "num_heads": 2,
                          "intermediate_size": 128, "out_hidden_size": 64}}
# GPTQModel's per-module override: every down_proj at 8 bits (what quantize --int8-targets
# writes, in GPTQ's spelling)
GPTQ_INT8_DOWN = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False,
                  "sym": False, "dynamic": {"+:.*down_proj": {"bits": 8}}}


def builtin_config():
    return AutoConfig.from_pretrained(BUILTIN_CONFIGS["autoglm-phone-9b"], local_files_only=True)


def test_sub_configs_are_updated_key_by_key_and_other_keys_set():
    config = builtin_config()
    apply_hf_overrides(config, {**TINY, "quantization_config": GPTQ_INT8_DOWN,
                                "tie_word_embeddings": True})
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_key_value_heads) == (64, 2, 1)
    assert text.head_dim == 128 and text.vocab_size == 151552      # untouched keys stay
    assert (vision.depth, vision.out_hidden_size, vision.patch_size) == (1, 64, 14)
    assert config.quantization_config == GPTQ_INT8_DOWN            # a new key, as given
    assert config.tie_word_embeddings is True
    # a dict onto a plain (non-config) attribute replaces it, no merge
    apply_hf_overrides(config, {"quantization_config": {"quant_method": "awq"}})
    assert config.quantization_config == {"quant_method": "awq"}


def _decoder_linears(llm):
    model = llm.engine.core.loaded.model
    return {name: mod.linear_method for name, mod in model.named_modules()
            if hasattr(mod, "linear_method") and ".layers." in name and "visual" not in name}


def _generate(llm):
    out = llm.generate([[1000 + i for i in range(24)]],
                       SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    return out[0].outputs[0].token_ids


def test_engine_builds_the_overridden_model_with_8_bit_down_proj_on_cpu():
    """The override reaches the model (2 decoder layers of hidden 64) and the quantization
    config: down_proj 8-bit, the other decoder Linears 4-bit; it generates."""
    llm = LLM("autoglm-phone-9b", load_format="dummy", device="cpu", skip_tokenizer_init=True,
              max_model_len=512, num_kv_blocks=64,
              hf_overrides={**TINY, "quantization_config": GPTQ_INT8_DOWN})
    try:
        methods = _decoder_linears(llm)
        assert len({name.split(".layers.")[1].split(".")[0] for name in methods}) == 2
        bits = {name.rsplit(".", 1)[-1]: m.scheme.bits for name, m in methods.items()
                if isinstance(m, WNA16LinearMethod)}
        assert bits == {"qkv_proj": 4, "o_proj": 4, "gate_up_proj": 4, "down_proj": 8}
        # the start-up report names the mix
        assert llm.engine.core.loaded.quantization == (
            "gptq: W4A16 (group 32, zero points); W8A16 (group 32, zero points) for "
            "re:.*down_proj (from the checkpoint)")
        assert len(_generate(llm)) == 8
    finally:
        llm.shutdown()


@pytest.mark.gpu
def test_8_bit_down_proj_decodes_in_cuda_graphs_as_it_does_eagerly():
    """On the GPU the 8-bit down_proj takes its decode GEMV (checked at start-up) inside the
    decode CUDA graphs; greedy tokens equal an eager engine's on the same random weights."""
    from autoglm_serve.kernels import w8a16_gemv
    runs = []
    for eager in (False, True):
        llm = LLM("autoglm-phone-9b", load_format="dummy", skip_tokenizer_init=True,
                  max_model_len=512, max_num_seqs=4, enforce_eager=eager,
                  hf_overrides={**TINY, "quantization_config": GPTQ_INT8_DOWN})
        try:
            assert w8a16_gemv.ENABLED
            assert (llm.engine.core.runner.graphs is None) == eager
            runs.append(_generate(llm))
        finally:
            llm.shutdown()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    assert runs[0] == runs[1]

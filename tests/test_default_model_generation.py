"""The embedded default (SmolLM2-135M-Instruct, real weights) against transformers' generate."""
import pytest
import torch

from autoglm_serve import SamplingParams
from autoglm_serve.loader import default_model_path

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a GPU is in one paragraph.",
    "List three fruits that are red.",
    "How do I open the settings app on an Android phone?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 7?",
    "Give me a short tip for writing clean Python code.",
]


@pytest.fixture(scope="module")
def hf_model_and_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval(), tok


def test_greedy_equals_transformers_generate(default_llm_float32, hf_model_and_tokenizer):
    model, tok = hf_model_and_tokenizer
    chats = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                     add_generation_prompt=True) for p in PROMPTS]
    prompt_ids = [tok.encode(c, add_special_tokens=False) for c in chats]
    params = SamplingParams(temperature=0, max_tokens=64, min_tokens=64, ignore_eos=True)
    outs = default_llm_float32.generate(prompt_ids, params)
    for ids, out in zip(prompt_ids, outs):
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                 dtype=torch.long), max_new_tokens=64, min_new_tokens=64,
                                 do_sample=False, pad_token_id=tok.eos_token_id)
        assert out.outputs[0].token_ids == ref[0, len(ids):].tolist()


def test_chat_answers_sensibly(default_llm):
    out = default_llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                           SamplingParams(temperature=0, max_tokens=32))[0]
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"


def test_default_on_a_bf16_cpu_decodes_from_its_4bit_weights(default_llm):
    from autoglm_serve.models.layers.cpu_int4_linear import CpuInt4LinearMethod, cpu_int4_available
    loaded = default_llm.engine.core.loaded
    if not cpu_int4_available():
        assert loaded.dtype == torch.float32
        return
    assert loaded.dtype == torch.bfloat16
    layers = [m for m in loaded.model.modules() if hasattr(m, "linear_method")]
    # every decoder linear of the Q4_1 file (q/k/v, o, gate/up, down: 4 fused layers x 30)
    assert sum(isinstance(m.linear_method, CpuInt4LinearMethod) for m in layers) == 4 * 30
    assert "120 linears already 4-bit" in loaded.quantization

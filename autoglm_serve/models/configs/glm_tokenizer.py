"""A stand-in GLM-4.1V tokenizer for the packaged architecture config.

``autoglm-serve serve autoglm-phone-9b --load-format dummy`` runs the real architecture without
the checkpoint, and so without its 151k-token BPE. This tokenizer keeps what the engine and the
API depend on: GLM's special tokens at their real ids, the GLM-4.1V chat template, and a byte
level text encoding (ids 0..255; any text round-trips). Token counts of text differ from the real
tokenizer's (one token per byte): benchmarks that care give prompts as token ids. A real
checkpoint directory brings its own tokenizer and template, which always win.
"""
from __future__ import annotations

# GLM's special tokens in the order of their ids; the first 16 are GLM-4's (151329 ...).
SPECIAL_TOKENS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|image|>", "<|video|>",
    "<think>", "</think>", "<answer>", "</answer>",
]
FIRST_SPECIAL_ID = 151329

CHAT_TEMPLATE = """[gMASK]<sop>
{%- for msg in messages %}
{%- if msg.role == 'system' %}<|system|>
{% if msg.content is string %}{{ msg.content }}{% else %}{% for item in msg.content %}{% if item.type == 'text' %}{{ item.text }}{% endif %}{% endfor %}{% endif %}
{%- elif msg.role == 'user' %}<|user|>
{% if msg.content is string %}{{ msg.content }}{% else %}{% for item in msg.content %}
{%- if item.type in ('image', 'image_url') or 'image' in item %}<|begin_of_image|><|image|><|end_of_image|>
{%- elif item.type == 'text' %}{{ item.text }}{% endif %}
{%- endfor %}{% endif %}
{%- elif msg.role == 'assistant' %}
{%- set content = msg.content if msg.content is string else '' %}
{%- if '</think>' in content %}{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}
{{- '<|assistant|>\\n' + content }}
{%- elif msg.role in ('tool', 'observation') %}<|observation|>
{{ msg.content }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>
{% if enable_thinking is defined and not enable_thinking %}<think></think>
{% endif %}{% endif %}"""


def byte_level_glm_tokenizer(first_special_id: int = FIRST_SPECIAL_ID):
    """Byte-level BPE without merges (ids 0..255), reserved fillers up to ``first_special_id``,
    then GLM's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for i in range(len(vocab), first_special_id):
        vocab[f"<|reserved_{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS, padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    ids = fast.convert_tokens_to_ids(SPECIAL_TOKENS)
    if ids != list(range(first_special_id, first_special_id + len(SPECIAL_TOKENS))):
        raise RuntimeError(f"special tokens landed at {ids[:3]}..., not at {first_special_id}")
    return fast

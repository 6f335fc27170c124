"""A stand-in GLM-4.1V tokenizer for the packaged architecture config.

``autoglm-serve serve autoglm-phone-9b --load-format dummy`` runs the real architecture without
the checkpoint, and so without its 151k-token BPE. This tokenizer keeps what the engine and the
API depend on: GLM's control tokens at their real ids, the reasoning tags at theirs, GLM-4.1V's
published chat template, and a byte level text encoding (ids 0..255; any text round-trips, and
so do generated ids). Token counts of text differ from the real tokenizer's (one token per
byte): benchmarks that care give prompts as token ids. A real checkpoint directory brings its
own tokenizer and template, which always win.
"""
from __future__ import annotations

# GLM's control tokens, from id 151329 on: special (skip_special_tokens drops them).
SPECIAL_TOKENS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|image|>", "<|video|>",
]
# GLM-4.1V's reasoning tags, by offset from <|endoftext|> (</answer> is 151348, an EOS id of the
# published generation config). They are ordinary tokens there: decoded text keeps them.
TAG_OFFSETS = {"<answer>": 18, "</answer>": 19, "<think>": 21, "</think>": 22}
FIRST_SPECIAL_ID = 151329
NUM_GLM_TOKENS = max(TAG_OFFSETS.values()) + 1     # ids first_special_id .. + 22 are GLM's


def glm_token_ids(first_special_id: int = FIRST_SPECIAL_ID) -> dict[str, int]:
    """Every GLM token (control tokens and tags) → its id."""
    ids = {tok: first_special_id + i for i, tok in enumerate(SPECIAL_TOKENS)}
    ids.update({tok: first_special_id + off for tok, off in TAG_OFFSETS.items()})
    return ids


# GLM-4.1V-9B-Thinking's published chat template, token for token. Its points: system and user
# turns open with "<|role|>\n"; in a user turn's parts list, images and videos become their
# placeholder (no separator before the text that follows); an assistant turn is replayed as
# given (thinking included), "<|assistant|>" + metadata when it has one; tool and observation
# turns are not rendered; the generation prompt is "<|assistant|>\n" (the model always thinks,
# so there is no enable_thinking switch).
CHAT_TEMPLATE = """[gMASK]<sop>
{%- for msg in messages %}
{%- if msg.role == 'system' %}
<|system|>
{{ msg.content }}
{%- elif msg.role == 'user' %}
<|user|>
{% if msg.content is string %}{{ msg.content }}{% else %}
{%- for item in msg.content %}
{%- if item.type == 'video' or 'video' in item %}<|begin_of_video|><|video|><|end_of_video|>
{%- elif item.type == 'image' or 'image' in item %}<|begin_of_image|><|image|><|end_of_image|>
{%- elif item.type == 'text' %}{{ item.text }}
{%- endif %}
{%- endfor %}
{%- endif %}
{%- elif msg.role == 'assistant' %}
<|assistant|>{{ msg.metadata if msg.metadata else '' }}
{{ msg.content }}
{%- endif %}
{%- endfor %}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""


def byte_level_glm_tokenizer(first_special_id: int = FIRST_SPECIAL_ID):
    """Byte-level BPE without merges (ids 0..255), reserved fillers up to ``first_special_id``,
    then GLM's tokens at their offsets (fillers where GLM-4.1V has tokens we do not use)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    named = {i: tok for tok, i in glm_token_ids(first_special_id).items()}
    fillers = []
    for i in range(len(vocab), first_special_id + NUM_GLM_TOKENS):
        name = named.get(i)
        if name is None:
            name = f"<|reserved_{i}|>"
            fillers.append(name)
        vocab[name] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # Already in the vocab, so each keeps its id; added, so text containing it maps to it. The
    # fillers too: a random-weight model's replies are mostly fillers, and a phone agent sends
    # them back as history, which must cost what the real tokenizer's would (a token for a
    # token), not a token per byte (17 for one filler).
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in [*TAG_OFFSETS, *fillers]])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS, padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    expected = glm_token_ids(first_special_id)
    got = dict(zip(expected, fast.convert_tokens_to_ids(list(expected))))
    if got != expected:
        raise RuntimeError(f"GLM tokens landed at {got}, not at {expected}")
    return fast

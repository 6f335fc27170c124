"""Build a tiny random LlamaForCausalLM checkpoint with a word-level tokenizer and a chat template.

No model hub is reachable from the test machines, so tests that need a real server on a real
checkpoint build one here (a few hundred KiB, loads in well under a second on CPU).

    from tests.tiny_llama import build_tiny_llama
    path = build_tiny_llama(tmp_path / "tiny-llama")
"""

from __future__ import annotations

import json
from pathlib import Path

# Plain words so that random token ids decode to readable, re-tokenizable text (one word = one id).
_WORDS = (
    "the a an phone screen tap swipe open app home back settings search type text button menu "
    "wifi battery camera photo message call contact email map music video clock alarm weather "
    "shop cart order pay price item list next previous scroll up down left right top bottom "
    "click press hold launch close find select confirm cancel ok yes no done wait retry "
    "step task goal plan think answer action element position center window page tab link"
).split()

SPECIAL_TOKENS = ["<unk>", "<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]

# Roles as special tokens; content rendered as plain text; generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set content = message['content'] %}"
    "{% else %}{% set content = message['content'] | selectattr('type', 'equalto', 'text') "
    "| map(attribute='text') | join(' ') %}{% endif %}"
    "<|{{ message['role'] }}|> {{ content }} "
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def build_tiny_llama(
    out_dir: str | Path,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    max_position_embeddings: int = 4096,
    seed: int = 0,
) -> Path:
    """Save a random tiny Llama + tokenizer to `out_dir` and return the path."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word in dict.fromkeys(_WORDS):
        vocab[word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<pad>"],
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # A random model repeats its last token under greedy decoding when embeddings are tied, and a
    # special token (end of the chat prompt) would then stream as empty text. An untied head whose
    # special-token rows are zero and whose word rows are large always picks (varied) plain words,
    # so streams carry text and never stop early on EOS.
    with torch.no_grad():
        head = model.lm_head.weight
        head.normal_(0.0, 1.0)
        head[: len(SPECIAL_TOKENS)] = 0.0
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": vocab["<s>"],
                "eos_token_id": vocab["</s>"],
                "pad_token_id": vocab["<pad>"],
                "do_sample": False,
            }
        )
    )
    return out


if __name__ == "__main__":
    import sys

    print(build_tiny_llama(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-llama"))

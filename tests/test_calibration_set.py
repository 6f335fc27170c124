"""The built-in calibration set: chats in the model's template, and every third sample a plain
document, so that not every sample opens on the same (attention-sink) token."""
import pytest

pytest.importorskip("compressed_tensors")


def test_every_third_sample_is_a_plain_document():
    from transformers import AutoTokenizer
    from autoglm_serve.loader.model_path import resolve_model_path
    from autoglm_serve.quantize.calibration import calibration_samples
    from autoglm_serve.quantize.calibration_documents import DOCUMENTS

    gguf = resolve_model_path(None).path
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    samples = calibration_samples(tok, num_samples=9, max_tokens=64)
    assert len(samples) == 9 and all(s.input_ids.shape[1] <= 64 for s in samples)
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    template_start = tok(chat, add_special_tokens=False).input_ids[0]
    firsts = [int(s.input_ids[0, 0]) for s in samples]
    for i, first in enumerate(firsts):
        assert (first == template_start) == (i % 3 != 2), (i, firsts)
    texts = [tok.decode(samples[i].input_ids[0]) for i in (2, 5, 8)]
    assert [t for t in texts if not any(d.startswith(t) for d in DOCUMENTS)] == []
    assert len(set(firsts[2::3])) == 3      # three documents, three different opening tokens
    # deterministic: the same set every time
    again = calibration_samples(tok, num_samples=9, max_tokens=64)
    assert all((a.input_ids == b.input_ids).all() for a, b in zip(samples, again))

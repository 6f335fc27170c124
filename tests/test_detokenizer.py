"""Incremental detokenization: the streamed text equals a plain decode, characters split across
byte tokens appear only once complete, and stop strings cut the text wherever they fall."""
import pytest

from autoglm_serve.engine.frontend.detokenizer import IncrementalDetokenizer
from tests.glm4v_fixtures import tiny_tokenizer

TEXT = "héllo wörld, 你好 🙂 done"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()      # byte-level: a non-ASCII character spans several tokens


def stream(detok, ids, chunk):
    pieces = []
    for i in range(0, len(ids), chunk):
        detok.add_tokens(ids[i:i + chunk])
        pieces.append(detok.new_text(finished=False))
    pieces.append(detok.new_text(finished=True))
    return pieces


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_streamed_text_is_the_decoded_text(tok, chunk):
    prompt = tok.encode("say: ", add_special_tokens=False)
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) > len(TEXT)                   # some characters are several tokens
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = stream(detok, ids, chunk)
    assert "".join(pieces) == detok.text == tok.decode(ids) == TEXT
    assert not any("\ufffd" in p for p in pieces)
    assert detok.stop_reason is None


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_tokens_cuts_the_text(tok, include):
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [], stop=["xyz", "rld, 你"],
                                   include_stop_str_in_output=include)
    pieces = stream(detok, ids, 1)
    end = TEXT.index("rld, 你") + (len("rld, 你") if include else 0)
    assert detok.stop_reason == "rld, 你" and detok.text == TEXT[:end]
    assert "".join(pieces) == TEXT[:end]
    # a possible start of a stop string is held back until it is known not to be one
    assert all(not p.endswith(("r", "rl", "rld")) for p in pieces)

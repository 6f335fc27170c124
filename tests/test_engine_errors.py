"""Bad input fails clearly and leaves the engine serving; aborts, n, stops, logprobs."""
import json

import pytest
import torch

from autoglm_serve import LLM, SamplingParams
from tests.test_engine_oracle import hf_greedy_with_logits
from tests.tiny_models import build_tiny_decoder

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 17, 33, 2, 9, 41, 7], list(range(10, 50)), [3] * 5 + [60, 61, 62]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path, hf = build_tiny_decoder(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    # small budgets: the 40-token prompt is prefilled over several steps
    llm = LLM(str(path), skip_tokenizer_init=True, block_size=8, dtype="float32",
              max_model_len=64, max_num_batched_tokens=16, num_kv_blocks=32)
    return llm, hf, path


def serves(llm: LLM, prompt=PROMPTS[0]) -> list[int]:
    out = llm.generate([prompt], GREEDY)[0]
    assert len(out.outputs[0].token_ids) == 8 and out.outputs[0].finish_reason == "length"
    return out.outputs[0].token_ids


# ---- bad input ----------------------------------------------------------------------------
def test_bad_prompts_fail_clearly_and_the_engine_keeps_serving(tiny):
    llm, _, _ = tiny
    before = serves(llm)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([[]], GREEDY)
    with pytest.raises(ValueError, match=r"maximum context length is 64 tokens, but the prompt has 70"):
        llm.generate([[1] * 70], GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 2, 500]], GREEDY)
    # a bad prompt in a batch fails the whole call and leaves nothing behind
    with pytest.raises(ValueError, match="maximum context length"):
        llm.generate([PROMPTS[0], [1] * 64], GREEDY)
    core = llm.engine.core
    assert not core.has_unfinished() and core.kv.num_free_blocks == core.kv.num_blocks
    assert serves(llm) == before


def test_text_prompt_errors(default_llm):
    with pytest.raises(ValueError, match="prompt is empty"):
        default_llm.generate([""], GREEDY)
    out = default_llm.generate(["Hello"], GREEDY)[0]
    assert len(out.outputs[0].token_ids) == 8


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=-3), "max_tokens"),
    (dict(temperature=-0.5), "temperature"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(n=0), "n"), (dict(logprobs=100), "logprobs")])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field} must"):
        SamplingParams(**kwargs)


def test_unknown_model_path():
    with pytest.raises(FileNotFoundError, match="/nonexistent"):
        LLM("/nonexistent")


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_safetensors(tmp_path, damage):
    path, _ = build_tiny_decoder(tmp_path / "m", "llama")
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2] if damage == "truncate" else b"\x07garbage" * 64)
    with pytest.raises(ValueError, match=r"model\.safetensors: corrupt or truncated"):
        LLM(str(path), skip_tokenizer_init=True, num_kv_blocks=8)


def test_unknown_architecture(tmp_path):
    path, _ = build_tiny_decoder(tmp_path / "m", "llama")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["FancyNewForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"FancyNewForCausalLM.*not supported.*LlamaForCausalLM"):
        LLM(str(path), skip_tokenizer_init=True, num_kv_blocks=8)


# ---- aborts ------------------------------------------------------------------------------
def run_to_end(engine) -> dict[str, list[int]]:
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return done


@pytest.mark.parametrize("when", ["waiting", "mid-prefill", "mid-decode"])
def test_abort_frees_blocks_and_others_are_unaffected(tiny, when):
    llm, _, _ = tiny
    engine, core = llm.engine, llm.engine.core
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    others = {"a": PROMPTS[0], "b": PROMPTS[2]}
    for rid, p in others.items():
        engine.add_request(f"ref-{rid}", engine.frontend.prepare(p), params)
    reference = run_to_end(engine)

    victim_prompt = PROMPTS[1]                      # 40 tokens: 3 steps of prefill at most
    if when == "waiting":                           # queued behind the running others
        for rid, p in others.items():
            engine.add_request(rid, engine.frontend.prepare(p), params)
        engine.step()
        engine.add_request("victim", engine.frontend.prepare(victim_prompt), params)
    else:
        engine.add_request("victim", engine.frontend.prepare(victim_prompt), params)
        for rid, p in others.items():
            engine.add_request(rid, engine.frontend.prepare(p), params)
        engine.step()
        if when == "mid-decode":
            while core.requests["victim"].num_output_tokens < 2:
                engine.step()
    victim = core.requests["victim"]
    if when == "waiting":
        assert victim.status.value == "waiting" and victim.block_ids == []
    elif when == "mid-prefill":
        assert 0 < victim.num_computed_tokens < victim.num_prompt_tokens
    else:
        assert victim.num_output_tokens >= 2
    held = len(victim.block_ids)
    free = core.kv.num_free_blocks
    engine.abort("victim")
    assert victim.status.value == "abort" and victim.block_ids == []
    assert core.kv.num_free_blocks == free + held
    done = run_to_end(engine)
    assert "victim" not in done
    assert done["a"] == reference["ref-a"] and done["b"] == reference["ref-b"]
    assert core.kv.num_free_blocks == core.kv.num_blocks
    assert serves(llm)


# ---- n, stops, limits ----------------------------------------------------------------------
def test_n_returns_distinct_samples(default_llm):
    out = default_llm.generate(["Write a word."], SamplingParams(n=4, temperature=1.0,
                                                                 max_tokens=12, seed=3))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    samples = {tuple(c.token_ids) for c in out.outputs}
    assert len(samples) == 4


def _boundary_stop(tokenizer, token_ids: list[int], text: str) -> tuple[str, int]:
    """A stop string made of the end of one token and the start of the next, and where its
    first occurrence starts in text."""
    for i in range(2, len(token_ids) - 1):
        head = tokenizer.decode(token_ids[:i])
        nxt = tokenizer.decode(token_ids[:i + 1])[len(head):]
        if len(head) >= 2 and len(nxt) >= 2 and head[-2:].strip() and nxt[:2].strip():
            stop = head[-2:] + nxt[:2]
            if text.find(stop) == len(head) - 2:
                return stop, len(head) - 2
    raise AssertionError("no stop string across a token boundary found")


def test_stop_string_split_across_tokens_is_cut(default_llm):
    tok = default_llm.tokenizer
    prompt = tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "Write two sentences about the moon."}], tokenize=False,
        add_generation_prompt=True), add_special_tokens=False)
    full = default_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40))[0]
    c = full.outputs[0]
    stop, at = _boundary_stop(default_llm.tokenizer, c.token_ids, c.text)
    out = default_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40,
                                                        stop=[stop]))[0].outputs[0]
    assert out.text == c.text[:at] and stop not in out.text
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.token_ids == c.token_ids[:len(out.token_ids)]
    # streamed: the pieces never show a part of the stop string either
    engine = default_llm.engine
    engine.add_request("stream", engine.frontend.prepare(prompt),
                       SamplingParams(temperature=0, max_tokens=40, stop=[stop]), delta=True)
    pieces = []
    while engine.has_unfinished():
        for o in engine.step():
            pieces.append(o.outputs[0].text if o.outputs else "")
    assert "".join(pieces) == c.text[:at]
    assert not any(p and c.text[:at].find(p) < 0 for p in pieces)


def test_stop_token_ids_eos_and_max_tokens(tiny):
    llm, hf, _ = tiny
    prompt, eos = PROMPTS[1], hf.config.eos_token_id
    ref, _ = hf_greedy_with_logits(hf, prompt, 16)
    k = next(i for i in range(3, 12) if ref[i] not in ref[:i])
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12,
                                                stop_token_ids=[ref[k]]))[0].outputs[0]
    assert out.token_ids == ref[:k + 1] and out.finish_reason == "stop"
    assert out.stop_reason == ref[k]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=5,
                                                ignore_eos=True))[0].outputs[0]
    assert out.token_ids == ref[:5] and out.finish_reason == "length"
    # this prompt's greedy path reaches EOS: it stops there unless told to ignore it
    e = ref.index(eos)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0]
    assert out.token_ids == ref[:e + 1] and out.finish_reason == "stop"
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16,
                                                ignore_eos=True))[0].outputs[0]
    assert out.token_ids == ref and out.finish_reason == "length"


def test_min_tokens_matches_transformers(tiny):
    llm, hf, _ = tiny
    ref, _ = hf_greedy_with_logits(hf, PROMPTS[1], 12)
    k = next(i for i in range(3, 12) if ref[i] not in ref[:i])
    stop, eos = ref[k], hf.config.eos_token_id
    ids = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=16, min_new_tokens=k + 3,
                               eos_token_id=[eos, stop], pad_token_id=0)[0, ids.shape[1]:]
    out = llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=16,
                                                    min_tokens=k + 3,
                                                    stop_token_ids=[stop]))[0].outputs[0]
    assert out.token_ids == expected.tolist()
    assert stop not in out.token_ids[:k + 3] and len(out.token_ids) >= k + 3


def test_logprobs_equal_transformers_log_softmax(tiny):
    llm, hf, _ = tiny
    for prompt in PROMPTS[:2]:
        ref_tokens, ref_logits = hf_greedy_with_logits(hf, prompt, 10)
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10,
                                                    ignore_eos=True, logprobs=5))[0].outputs[0]
        assert out.token_ids == ref_tokens and len(out.logprobs) == 10
        total = 0.0
        for token, entry, logits in zip(out.token_ids, out.logprobs, ref_logits):
            expected = torch.log_softmax(logits.double(), dim=-1)
            top = torch.topk(expected, 5)
            assert abs(entry[token].logprob - expected[token].item()) < 1e-4
            assert entry[token].rank == 1                 # greedy: the most likely token
            ranked = sorted((lp.rank, tid) for tid, lp in entry.items())
            assert [tid for _, tid in ranked] == top.indices.tolist()
            for tid, value in zip(top.indices.tolist(), top.values.tolist()):
                assert abs(entry[tid].logprob - value) < 1e-4
            total += expected[token].item()
        assert abs(out.cumulative_logprob - total) < 1e-3

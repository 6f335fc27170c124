"""--decode-step-tokens: while a request decodes, a step carries at most that many tokens, so a
long prompt arriving behind it is chunked finer; with nothing decoding, the step gets the whole
max_num_batched_tokens. Read through the step trace (engine/step_trace.py), whose lines must say
what each step scheduled."""
import json

import pytest

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.engine.frontend.input_processor import PreparedPrompt
from autoglm_serve.engine.step_trace import StepTrace
from tests.tiny_models import build_tiny_decoder

LONG = [(7 * i) % 120 + 1 for i in range(300)]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return build_tiny_decoder(tmp_path_factory.mktemp("m"), "llama", vocab_size=128)[0]


def traced_run(path, trace_path, **kw):
    llm = LLM(str(path), skip_tokenizer_init=True, block_size=8, num_kv_blocks=128,
              max_num_batched_tokens=128, **kw)
    engine = llm.engine
    trace = StepTrace(str(trace_path))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine.add_request("decoding", PreparedPrompt([5, 9, 2]), params, final_only=True)
    for _ in range(3):           # the short prompt is decoding before the long one arrives
        engine.step()
        trace.step_done(engine.core, 0.0)
    engine.add_request("long", PreparedPrompt(LONG), params, final_only=True)
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] = out
        trace.step_done(engine.core, 0.0)
    trace.close()
    return outputs, [json.loads(line) for line in open(trace_path)]


def test_steps_with_decodes_stay_within_the_decode_budget(path, tmp_path):
    base, base_steps = traced_run(path, tmp_path / "base.jsonl")
    small, steps = traced_run(path, tmp_path / "small.jsonl", decode_step_tokens=40)
    # the long prompt went in chunks of at most 40 tokens less the decode's one...
    chunks = [s["prompt_tokens"] for s in steps if s["prompt_tokens"]]
    assert chunks[0] == 3 and sum(chunks[1:]) == len(LONG) and max(chunks[1:]) <= 39
    assert all(s["prompt_tokens"] + s["decode_rows"] <= 40 for s in steps)
    assert any(s["decode_rows"] for s in steps if s["prompt_tokens"])   # decodes rode along
    # ...and without the budget in chunks of up to the full 128
    base_chunks = [s["prompt_tokens"] for s in base_steps if s["prompt_tokens"]][1:]
    assert sum(base_chunks) == len(LONG) and max(base_chunks) == 127
    # the same greedy tokens either way
    assert {k: v.outputs[0].token_ids for k, v in small.items()} == \
        {k: v.outputs[0].token_ids for k, v in base.items()}
    # the trace times each part of a batched step
    assert all(s["launch_ms"] >= 0 and s["wait_ms"] >= 0 for s in steps if "launch_ms" in s)
    # the launch's CPU time is this thread's: not more than the launch's wall time, within
    # what two clocks (the scheduler's and the monotonic one) may drift apart on a loaded VM;
    # a CI run failed the 0.05 ms bound once, without saying which step: now it says
    launched = [s for s in steps if s["prompt_tokens"] or s["decode_rows"]]
    off = [s for s in launched if not 0 < s["launch_cpu_ms"] <= 1.05 * s["launch_ms"] + 0.2]
    assert not off, off


def test_a_prompt_alone_gets_the_whole_step(path, tmp_path):
    llm = LLM(str(path), skip_tokenizer_init=True, block_size=8, num_kv_blocks=128,
              max_num_batched_tokens=128, decode_step_tokens=40)
    engine = llm.engine
    trace = StepTrace(str(tmp_path / "alone.jsonl"))
    engine.add_request("long", PreparedPrompt(LONG), SamplingParams(max_tokens=2),
                       final_only=True)
    while engine.has_unfinished():
        engine.step()
        trace.step_done(engine.core, 0.0)
    trace.close()
    chunks = [json.loads(line)["prompt_tokens"] for line in open(tmp_path / "alone.jsonl")]
    assert chunks[:2] == [128, 128]

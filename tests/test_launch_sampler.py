"""Slow launches' stacks (engine/launch_sampler.py): a launch longer than the threshold gets the
core thread's sampled stacks, named down from the launch's caller; a short one gets none; and
with AUTOGLM_SLOW_LAUNCH_MS and a step trace, the engine's trace lines carry them."""
import json
import time

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.engine.frontend.input_processor import PreparedPrompt
from autoglm_serve.engine.launch_sampler import ENV, LaunchSampler
from autoglm_serve.engine.step_trace import StepTrace
from tests.tiny_models import build_tiny_decoder


def busy_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def sleeping_for(seconds: float) -> None:
    time.sleep(seconds)


def launch(sampler: LaunchSampler, work, seconds: float):
    sampler.begin()
    work(seconds)
    return sampler.end()


def test_a_slow_launch_gets_its_stacks_and_a_fast_one_none():
    sampler = LaunchSampler(threshold_s=0.02)
    try:
        assert launch(sampler, busy_for, 0.001) is None
        for work in (busy_for, sleeping_for):
            seen = launch(sampler, work, 0.15)
            assert seen is not None and seen["samples"] >= 3, seen
            stack, count = seen["stacks"][0]
            # innermost first, down to the caller's frame (this test's launch helper) only
            assert stack.startswith("test_launch_sampler.py:") and work.__name__ in stack
            assert stack.split(" < ")[-1].endswith(work.__name__), stack
            assert count <= seen["samples"]
        # a fast launch after a slow one still gets nothing
        assert launch(sampler, busy_for, 0.001) is None
    finally:
        sampler.close()


def test_the_engine_traces_its_launches_stacks(tmp_path, monkeypatch):
    """Threshold 0: every launch is sampled from its start, so the lines show the runner."""
    monkeypatch.setenv(ENV, "0")
    path = build_tiny_decoder(tmp_path / "m", "llama", vocab_size=128)[0]
    trace_path = tmp_path / "steps.jsonl"
    llm = LLM(str(path), skip_tokenizer_init=True, block_size=8, num_kv_blocks=128,
              step_trace_path=str(trace_path))
    engine = llm.engine
    assert engine.core.launch_sampler is not None
    trace = StepTrace(str(trace_path))
    engine.add_request("r", PreparedPrompt([(7 * i) % 120 + 1 for i in range(100)]),
                       SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                       final_only=True)
    while engine.has_unfinished():
        engine.step()
        trace.step_done(engine.core, 0.0)
    trace.close()
    lines = [json.loads(line) for line in open(trace_path)]
    sampled = [line["launch_stacks"] for line in lines if "launch_stacks" in line]
    assert sampled, lines
    stacks = [stack for seen in sampled for stack, _ in seen["stacks"]]
    # named from inside the launch down to the runner's launch, not the core's step
    assert any("runner.py" in s and " launch" in s for s in stacks), stacks
    assert not any("_batched_step" in s for s in stacks), stacks
    engine.core.shutdown()
    assert engine.core.launch_sampler is None


def test_without_the_variable_nothing_is_sampled(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    path = build_tiny_decoder(tmp_path / "m", "llama", vocab_size=128)[0]
    llm = LLM(str(path), skip_tokenizer_init=True, block_size=8, num_kv_blocks=128,
              step_trace_path=str(tmp_path / "steps.jsonl"))
    assert llm.engine.core.launch_sampler is None

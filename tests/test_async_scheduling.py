"""Async scheduling (step N+1 prepared while step N runs, in-flight tokens fed on the device)
gives exactly the synchronous engine's outputs, and leaks nothing when requests stop or are
aborted while a step is in flight."""
import pytest

from autoglm_serve.engine.core.warm_up import warm_up
from autoglm_serve import LLM, SamplingParams
from autoglm_serve.engine.frontend.input_processor import PreparedPrompt
from tests.tiny_models import build_tiny_decoder

PROMPTS = [[5, 9, 2, 77, 31], list(range(20, 70)), [3] * 12, [99, 98, 97]]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return build_tiny_decoder(tmp_path_factory.mktemp("m"), "glm4", vocab_size=128)[0]


def engine(path, async_scheduling, **kw):
    return LLM(str(path), skip_tokenizer_init=True, block_size=8, num_kv_blocks=64,
               max_num_batched_tokens=24, async_scheduling=async_scheduling, **kw)


PARAMS = [
    SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
    SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[7, 11, 42, 64]),
    SamplingParams(temperature=0.9, seed=3, max_tokens=12, n=2),
    SamplingParams(temperature=0.7, seed=5, max_tokens=12, frequency_penalty=0.5,
                   repetition_penalty=1.2),              # penalties: counted on the device
    SamplingParams(temperature=0, max_tokens=8, logprobs=3, min_tokens=4),
]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "stop_tokens", "seeded_n2",
                                                "penalties", "logprobs_min_tokens"])
def test_same_outputs_as_synchronous(path, params):
    outs = {}
    for mode in (False, True):
        llm = engine(path, mode)
        res = llm.generate(PROMPTS, params)
        outs[mode] = [[(c.token_ids, c.finish_reason, c.logprobs) for c in o.outputs]
                      for o in res]
        assert all(c.finish_reason in ("length", "stop") for o in res for c in o.outputs)
        if params.logprobs is not None:
            assert all(len(c.logprobs) == len(c.token_ids) for o in res for c in o.outputs)
        core = llm.engine.core
        assert core.kv.num_free_blocks == core.kv.num_blocks   # nothing held after the end
        assert core._inflight is None and not core.requests
    assert outs[True] == outs[False]


def test_abort_while_a_step_is_in_flight_frees_everything(path):
    llm = engine(path, True)
    eng = llm.engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", PreparedPrompt(p), params)
    for _ in range(6):
        eng.step()
    assert eng.core._inflight is not None          # a step is in flight right now
    eng.abort("r1")
    eng.abort("r3")
    finished = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = out
    assert set(finished) == {"r0", "r2"}
    assert all(len(o.outputs[0].token_ids) == 30 for o in finished.values())
    assert eng.core.kv.num_free_blocks == eng.core.kv.num_blocks
    # the survivors' tokens equal a run without the aborted requests
    ref = engine(path, False).generate([PROMPTS[0], PROMPTS[2]], params)
    assert [o.outputs[0].token_ids for o in ref] == \
        [finished["r0"].outputs[0].token_ids, finished["r2"].outputs[0].token_ids]


def test_warm_up_leaves_a_clean_engine(path):
    """The start-up warm-up (run on CUDA) on this device: afterwards no request, no held block,
    no counted token, and outputs as from a fresh engine."""
    llm = engine(path, True)
    core = llm.engine.core
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    before = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    warm_up(core)
    assert not core.requests and core._inflight is None
    assert core.kv.num_free_blocks == core.kv.num_blocks
    assert core.num_prompt_tokens_total == 0 and core.kv.prefix_hits == 0
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == before


def _tokens_after_each_step(eng) -> list[int]:
    eng.add_request("r", PreparedPrompt(PROMPTS[0]), SamplingParams(temperature=0, max_tokens=3,
                                                                     ignore_eos=True))
    seen, counts = 0, []
    while eng.has_unfinished():
        for out in eng.step():
            seen = len(out.outputs[0].token_ids)
        counts.append(seen)
    return counts


def test_cpu_default_hands_each_token_out_with_its_own_step(path):
    """On a CPU the step runs in the host's thread, so nothing overlaps: by default (unset)
    a step's token comes out of that step, not one step later."""
    llm = LLM(str(path), skip_tokenizer_init=True, block_size=8, num_kv_blocks=64, device="cpu")
    assert llm.engine.core.async_scheduling is False
    assert _tokens_after_each_step(llm.engine) == [1, 2, 3]
    assert _tokens_after_each_step(engine(path, True, device="cpu").engine) == [0, 1, 2, 3]


def test_logprobs_go_to_the_host_whole():
    """The async path's copy of a step's logprob tensors (pinned on a GPU) carries every field,
    in new host memory, the sampled tokens untouched."""
    import torch
    from autoglm_serve.engine.core.runner import logprobs_to_host
    from autoglm_serve.engine.core.sampler import LogprobsTensors, SamplerOutput, compute_logprobs
    logits = torch.randn(3, 50)
    tokens = logits.argmax(-1)
    out = SamplerOutput(tokens, compute_logprobs(logits, tokens, 4))
    host = logprobs_to_host(out, pin=False)
    assert host.sampled_token_ids is tokens
    assert isinstance(host.logprobs, LogprobsTensors)
    for name in ("sampled_logprobs", "sampled_ranks", "top_token_ids", "top_logprobs"):
        a, b = getattr(out.logprobs, name), getattr(host.logprobs, name)
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert logprobs_to_host(SamplerOutput(tokens, None), pin=False).logprobs is None

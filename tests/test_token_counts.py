"""Penalties on the async path (engine/core/token_counts.py): the device's count table agrees
with counts from the host's lists, and greedy decoding with Open-AutoGLM's frequency penalty,
presence and repetition penalties equals a reference loop over transformers' own logits, with
steps overlapped and requests preempted."""
import pytest
import torch

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.engine.core.request import Request, RequestStatus
from autoglm_serve.engine.core.token_counts import DeviceTokenCounts, token_counts
from tests.tiny_models import build_tiny_decoder

V = 50


def _request(rid, prompt, outputs=()):
    req = Request(rid, list(prompt), SamplingParams(frequency_penalty=0.2), frozenset(), 16)
    req.output_token_ids += outputs
    req.all_token_ids += outputs
    return req


def test_table_tracks_sampled_tokens_across_reuse_and_growth():
    table = DeviceTokenCounts(V, torch.device("cpu"))
    reqs = [_request(f"r{i}", [i, i + 1, 3], outputs=[7] * i) for i in range(20)]
    history = {r.request_id: list(r.output_token_ids) for r in reqs}
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        live = [r for r in reqs if not r.status.finished]
        used = [i % 3 != 2 for i in range(len(live))]       # some rows use no penalty
        slots, counts, mask = table.gather(live, used, repetition=step >= 3)
        expect = token_counts([history[r.request_id] if u else () for r, u in zip(live, used)],
                              V, "cpu")
        assert torch.equal(counts, expect)
        if step >= 3:
            prompts = token_counts([r.prompt_token_ids if u else () for r, u in zip(live, used)],
                                   V, "cpu") > 0
            assert torch.equal(mask, prompts)
        tokens = torch.randint(0, V, (len(live),), generator=gen)
        table.record(slots, tokens)
        for r, u, t in zip(live, used, tokens.tolist()):
            if u:
                history[r.request_id].append(t)     # what the host learns a step later
        reqs[step].status = RequestStatus.FINISHED_STOPPED   # its slot may be reused
        reqs.append(_request(f"new{step}", [1, 2]))          # ...by a newcomer, from zero
        history[f"new{step}"] = []
    assert table.capacity >= 16


def test_reserved_tables_hold_the_first_repetition_penalty_without_allocating():
    """The start-up profile reserves max_num_seqs slots before the KV cache is sized from what
    is left, so the first request with a repetition penalty must find its prompt mask there."""
    table = DeviceTokenCounts(V, torch.device("cpu"))
    table.reserve(8)
    counts, mask = table.counts.data_ptr(), table.prompt_mask.data_ptr()
    reqs = [_request(f"r{i}", [i, 40 + i]) for i in range(8)]
    _, _, got = table.gather(reqs[:3], [True] * 3, repetition=False)
    assert got is None
    _, _, got = table.gather(reqs, [True] * 8, repetition=True)
    assert (table.counts.data_ptr(), table.prompt_mask.data_ptr()) == (counts, mask)
    assert torch.equal(got, token_counts([r.prompt_token_ids for r in reqs], V, "cpu") > 0)


REFERENCE = [
    SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, frequency_penalty=0.2,
                   top_p=0.85),                                        # Open-AutoGLM's
    SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, presence_penalty=1.5,
                   frequency_penalty=-0.5),
    SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=1.8),
]


def _reference(model, prompt, p: SamplingParams):
    ids = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(p.max_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.numel()
                                    ).float() if out else torch.zeros_like(logits)
            if p.repetition_penalty != 1.0:
                seen = counts > 0
                seen[torch.tensor(prompt)] = True
                penalized = torch.where(logits > 0, logits / p.repetition_penalty,
                                        logits * p.repetition_penalty)
                logits = torch.where(seen, penalized, logits)
            logits = logits - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
            out.append(int(logits.argmax()))
            ids.append(out[-1])
    return out


@pytest.mark.parametrize("params", REFERENCE, ids=["open_autoglm", "presence", "repetition"])
def test_penalized_greedy_equals_reference_with_overlap_and_preemption(tmp_path, params):
    path, hf = build_tiny_decoder(tmp_path, "glm4", vocab_size=128)
    prompts = [[5, 9, 2, 77, 31], list(range(20, 60)), [3] * 12, [99, 98, 97]]
    # 14 blocks of 8 tokens cannot hold all four requests to the end: preemptions
    llm = LLM(str(path), skip_tokenizer_init=True, block_size=8, num_kv_blocks=14,
              max_num_batched_tokens=24, dtype="float32", async_scheduling=True)
    core = llm.engine.core
    overlapped = []
    step = core.step

    def watched_step():
        outputs = step()
        overlapped.append(core._inflight is not None)
        return outputs
    core.step = watched_step
    outs = llm.generate(prompts, params)
    assert core.scheduler.num_preemptions > 0
    assert sum(overlapped) > len(overlapped) // 2     # penalized steps were left in flight
    for out, prompt in zip(outs, prompts):
        assert out.outputs[0].token_ids == _reference(hf, prompt, params), prompt
    assert core.kv.num_free_blocks == core.kv.num_blocks

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch

from autoglm_serve.engine.core.sampler import (
    Sampler, SamplingBatch, SamplingRow, apply_min_p, apply_penalties, apply_top_k_top_p,
    make_generator)
from autoglm_serve.sampling_params import SamplingParams

NEG_INF = float("-inf")


def batch_of(params, V, prompts=None, outputs=None, eos=(), generators=None):
    B = len(params)
    rows = [SamplingRow(params=p,
                        prompt_token_ids=(prompts or [[]] * B)[i],
                        output_token_ids=(outputs or [[]] * B)[i],
                        generator=(generators or [None] * B)[i],
                        eos_token_ids=eos)
            for i, p in enumerate(params)]
    return SamplingBatch.build(rows, V, "cpu")


def sample(logits, params, **kw):
    logits = torch.as_tensor(logits, dtype=torch.float32)
    if logits.dim() == 1:
        logits = logits[None]
    return Sampler()(logits, batch_of(params, logits.shape[-1], **kw))


def survivors(masked_row):
    return set(torch.nonzero(masked_row > NEG_INF).flatten().tolist())


# ---------------------------------------------------------------- batch build

def test_build_counts_and_flags():
    params = [SamplingParams(repetition_penalty=1.3), SamplingParams(temperature=0, top_k=5),
              SamplingParams(frequency_penalty=0.5, top_p=0.9), SamplingParams(top_k=1)]
    prompts = [[1, 1, 4], [2, 2], [3], [0]]
    outputs = [[2, 2, 2, 9, 99, -1], [1], [4, 4, 0], [3]]  # 99 and -1 lie outside V=10
    b = batch_of(params, 10, prompts=prompts, outputs=outputs)
    assert b.any_repetition_penalty and b.any_frequency_presence
    assert b.any_top_p and not b.any_top_k  # top_k on greedy rows only: nothing to mask
    assert not b.all_greedy and b.any_greedy
    assert b.is_greedy.tolist() == [False, True, False, True]
    assert b.temperature.tolist() == [1.0, 1.0, 1.0, 1.0]  # greedy rows get 1.0
    assert b.max_num_logprobs is None
    expected_counts = torch.zeros(4, 10)
    for i, out in enumerate(outputs):
        if i in (0, 2):  # only rows with penalties pay for counts
            for t, c in Counter(t for t in out if 0 <= t < 10).items():
                expected_counts[i, t] = c
    assert torch.equal(b.output_counts, expected_counts)
    expected_mask = torch.zeros(4, 10, dtype=torch.bool)
    expected_mask[0, [1, 4]] = True  # only the repetition-penalty row needs its prompt
    assert torch.equal(b.prompt_mask, expected_mask)


def test_build_without_penalties_skips_count_tensors():
    b = batch_of([SamplingParams(), SamplingParams(temperature=0)], 8,
                 prompts=[[1, 2], [3]], outputs=[[4], [5]])
    assert b.output_counts is None and b.prompt_mask is None
    assert not b.any_repetition_penalty and not b.any_frequency_presence


# ---------------------------------------------------------------- penalties

def test_repetition_penalty_hand_computed():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]])
    b = batch_of([SamplingParams(repetition_penalty=2.0)], 6, prompts=[[0, 4]], outputs=[[1, 1]])
    got = apply_penalties(logits.clone(), b)
    # seen tokens 0, 1, 4: positive divided by 2, negative multiplied by 2; others untouched
    assert torch.allclose(got, torch.tensor([[1.0, -2.0, 0.5, 3.0, -4.0, 1.0]]))


def test_frequency_presence_penalty_on_output_only():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]])
    b = batch_of([SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)], 5,
                 prompts=[[0, 0, 3]], outputs=[[2, 2, 2, 4]])
    got = apply_penalties(logits.clone(), b)
    # token 2: 2 - 0.5*3 - 0.25 = 0.25; token 4: 4 - 0.5*1 - 0.25 = 3.25; prompt ignored
    assert torch.allclose(got, torch.tensor([[0.0, 1.0, 0.25, 3.0, 3.25]]))


def test_penalty_order_and_mixed_batch():
    logits = torch.tensor([[1.0, -1.0, 2.0], [1.0, -1.0, 2.0]])
    b = batch_of([SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0, presence_penalty=-0.5),
                  SamplingParams()], 3, prompts=[[0], [0]], outputs=[[1, 2, 2], [1, 2, 2]])
    got = apply_penalties(logits.clone(), b)
    # rep first, then OpenAI: t0 (prompt) 1/2; t1 -1*2 - 1*1 + 0.5; t2 2/2 - 1*2 + 0.5
    assert torch.allclose(got[0], torch.tensor([0.5, -2.5, -0.5]))
    assert torch.equal(got[1], logits[1])  # the row without penalties is untouched


def test_penalties_change_greedy_choice():
    # token 0 wins raw; after repetition penalty 2 on it (3 -> 1.5) token 1 (2.0) wins
    out = sample([3.0, 2.0, 1.0], [SamplingParams(temperature=0, repetition_penalty=2.0)],
                 prompts=[[0]])
    assert out.sampled_token_ids.tolist() == [1]


# ---------------------------------------------------------------- min_tokens

@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_masks_eos_and_stop_ids(ignore_eos):
    logits = [5.0, 1.0, 4.0, 3.0, 2.0]  # eos=0 best, then stop id 2, then 3
    p = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[2], ignore_eos=ignore_eos)
    out = sample(logits, [p], outputs=[[1, 1]], eos={0})
    assert out.sampled_token_ids.tolist() == [3]
    # once min_tokens outputs exist, eos is allowed again
    out = sample(logits, [p], outputs=[[1, 1, 1]], eos={0})
    assert out.sampled_token_ids.tolist() == [0]


def test_min_tokens_only_touches_its_row():
    logits = torch.tensor([[5.0, 1.0, 0.0], [5.0, 1.0, 0.0]])
    out = Sampler()(logits, batch_of([SamplingParams(temperature=0, min_tokens=2),
                                       SamplingParams(temperature=0)], 3, eos=[0]))
    assert out.sampled_token_ids.tolist() == [1, 0]


def test_min_tokens_masked_token_never_sampled_randomly():
    logits = torch.zeros(2000, 4)
    torch.manual_seed(0)
    out = Sampler()(logits, batch_of([SamplingParams(min_tokens=1, stop_token_ids=[3])] * 2000,
                                     4, eos=[1]))
    assert set(out.sampled_token_ids.tolist()) == {0, 2}


# ---------------------------------------------------------------- top-k / top-p / min-p

def masked(logits, params):
    logits = torch.as_tensor(logits, dtype=torch.float32)
    b = batch_of(params, logits.shape[-1])
    return apply_top_k_top_p(logits.clone(), b)


def test_top_k_keeps_k_largest_and_ties():
    x = masked([[1.0, 4.0, 2.0, 3.0, 0.0], [3.0, 2.0, 2.0, 0.0, -1.0], [1.0, 4.0, 2.0, 3.0, 0.0]],
               [SamplingParams(top_k=2), SamplingParams(top_k=2), SamplingParams()])
    assert survivors(x[0]) == {1, 3}
    assert survivors(x[1]) == {0, 1, 2}  # tied with the k-th largest: all kept
    assert survivors(x[2]) == {0, 1, 2, 3, 4}  # top-k off in this row
    assert torch.equal(x[0, [1, 3]], torch.tensor([4.0, 3.0]))  # kept values unchanged


def test_top_k_larger_than_vocab_keeps_all():
    x = masked([[1.0, 4.0, 2.0]], [SamplingParams(top_k=50)])
    assert survivors(x[0]) == {0, 1, 2}


def reference_top_p(probs, p):
    """Smallest set (by descending prob) whose mass reaches p, in float64."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = set(), 0.0
    for i in order:
        kept.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return kept


@pytest.mark.parametrize("top_p", [1e-9, 1e-6, 0.3, 0.55, 0.7, 0.85, 0.97, 1.0])
def test_top_p_matches_float64_reference(top_p):
    probs = [0.15, 0.5, 0.05, 0.3]
    x = masked([[math.log(p) for p in probs]], [SamplingParams(top_p=top_p)])
    assert survivors(x[0]) == reference_top_p(probs, top_p)


def test_top_p_one_keeps_even_negligible_tokens():
    x = masked([[0.0, -80.0, -200.0], [0.0, -80.0, -200.0]],
               [SamplingParams(top_p=1.0), SamplingParams(top_p=0.5)])
    assert survivors(x[0]) == {0, 1, 2}
    assert survivors(x[1]) == {0}


def test_top_p_mass_exactly_reaching_top_p_suffices():
    # probs [0.25, 0.5, 0.25] are exact in float32: token 1 alone reaches 0.5
    x = masked([[0.0, math.log(2), 0.0]], [SamplingParams(top_p=0.5)])
    assert survivors(x[0]) == {1}


def test_top_p_ties_at_boundary_are_kept():
    x = masked([[0.0, 0.0, -5.0]], [SamplingParams(top_p=0.3)])
    assert survivors(x[0]) == {0, 1}


def test_top_k_applies_before_top_p():
    probs = [0.5, 0.3, 0.15, 0.05]
    logits = [math.log(p) for p in probs]
    # top-k 2 renormalizes to [0.625, 0.375]: 0.625 alone reaches 0.6
    x = masked([logits, logits, logits],
               [SamplingParams(top_k=2, top_p=0.6), SamplingParams(top_p=0.6),
                SamplingParams(top_k=3)])
    assert survivors(x[0]) == {0}
    assert survivors(x[1]) == {0, 1}
    assert survivors(x[2]) == {0, 1, 2}  # top-k through the sort path gives the same mask
    y = masked([logits, logits], [SamplingParams(top_k=2, top_p=0.6), SamplingParams(top_k=3)])
    assert survivors(y[0]) == {0} and survivors(y[1]) == {0, 1, 2}  # the topk-only path


def test_top_k_top_p_path_top_p_one_and_ties():
    x = masked([[0.0, -80.0, -200.0, 1.0], [3.0, 2.0, 2.0, 0.0]],
               [SamplingParams(top_k=3, top_p=1.0), SamplingParams(top_k=2, top_p=0.99)])
    assert survivors(x[0]) == {0, 1, 3}
    assert survivors(x[1]) == {0, 1, 2}  # the tie at the k-th value is kept
    y = masked([[0.0, math.log(2), 0.0, -200.0]], [SamplingParams(top_k=3, top_p=0.5)])
    assert survivors(y[0]) == {1}  # mass exactly reaching top_p suffices here too


def reference_top_k_top_p(logits, k, p):
    """float64: keep the k largest, renormalize, then the smallest prefix reaching p."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])[:k]
    z = [math.exp(logits[i] - logits[order[0]]) for i in order]
    kept, mass = set(), 0.0
    for i, w in zip(order, z):
        kept.add(i)
        mass += w / sum(z)
        if mass >= p:
            break
    return kept


@pytest.mark.parametrize("force_sort", [False, True])
def test_top_k_top_p_both_paths_match_reference(force_sort):
    # all rows with top-k take the topk-only path; one row without top-k forces the full sort
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 64, generator=g, dtype=torch.float64) * 2
    ks = [2 + (i * 7) % 60 for i in range(40)]  # 2..61: below V, none greedy
    ps = [0.05 + 0.9 * ((i * 13) % 40) / 40 for i in range(40)]
    params = [SamplingParams(top_k=k, top_p=p, temperature=0.9) for k, p in zip(ks, ps)]
    params[0] = SamplingParams(top_p=ps[0]) if force_sort else params[0]
    b = batch_of(params, 64)
    assert b.all_top_k is not force_sort
    x = apply_top_k_top_p(logits.float(), b)
    for i in range(40):
        k = 64 if (force_sort and i == 0) else ks[i]
        assert survivors(x[i]) == reference_top_k_top_p(logits[i].tolist(), k, ps[i]), i


def test_min_p_hand_computed():
    probs = [0.5, 0.3, 0.15, 0.05]
    logits = torch.tensor([[math.log(p) for p in probs]] * 3)
    b = batch_of([SamplingParams(min_p=0.35), SamplingParams(min_p=0.0),
                  SamplingParams(min_p=1.0)], 4)
    x = apply_min_p(logits.clone(), b)
    assert survivors(x[0]) == {0, 1}  # threshold 0.35 * 0.5 = 0.175
    assert survivors(x[1]) == {0, 1, 2, 3}
    assert survivors(x[2]) == {0}


def test_min_p_applies_after_temperature():
    # at T=2, probs ∝ sqrt(p): ratios to the max are sqrt(0.3/0.5)=0.775, sqrt(0.15/0.5)=0.548,
    # sqrt(0.05/0.5)=0.316; min_p 0.5 keeps {0,1,2} (at T=1 it would keep {0,1}).
    probs = [0.5, 0.3, 0.15, 0.05]
    logits = torch.tensor([[math.log(p) for p in probs]] * 4000)
    torch.manual_seed(1)
    out = Sampler()(logits, batch_of([SamplingParams(temperature=2.0, min_p=0.5)] * 4000, 4))
    assert set(out.sampled_token_ids.tolist()) == {0, 1, 2}


# ---------------------------------------------------------------- greedy

def test_temperature_zero_and_top_k_one_are_argmax_in_mixed_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.8),
              SamplingParams(top_k=1, temperature=1.5), SamplingParams(temperature=1e-7),
              SamplingParams(temperature=0, top_p=0.01, min_p=0.9), SamplingParams(top_p=0.5)]
    out = Sampler()(logits, batch_of(params, 50))
    tokens = out.sampled_token_ids
    assert tokens.dtype == torch.int64 and tokens.shape == (6,)
    argmax = logits.argmax(-1)
    for i in (0, 2, 3, 4):
        assert tokens[i] == argmax[i]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sorting_the_half_precision_logits_keeps_every_cutoff(dtype):
    """The full sort may read the model's 16-bit logits when nothing but the temperature has
    changed them: the kept tokens and the sampled ones are the float32 sort's, ties (common
    in bf16) and rows with top-k or greedy included."""
    V, B = 4096, 12
    g = torch.Generator().manual_seed(3)
    raw = (torch.randn(B, V, generator=g) * 0.5).to(dtype)
    params = [SamplingParams(temperature=0.3 + 0.1 * i, top_p=0.5 + 0.04 * i,
                             top_k=50 * i if i % 3 == 1 else 0, seed=i) for i in range(B)]
    params[5] = SamplingParams(temperature=0)
    b = batch_of(params, V)
    assert b.any_top_p and not b.all_top_k
    x = raw.float().div_(b.temperature[:, None])
    from_raw = apply_top_k_top_p(x.clone(), b, raw)
    assert torch.equal(from_raw, apply_top_k_top_p(x.clone(), b))
    assert 1 < len(survivors(from_raw[0])) < V

    # ...and where more than the temperature changed them (the sort must then read those):
    # two tokens a row hold most of the mass, and each change below moves them
    top = raw.float().topk(64, dim=-1).indices.tolist()
    raw = raw.scatter_add(1, torch.tensor(top)[:, :2], torch.full((B, 2), 5.0, dtype=dtype))
    changed = [dict(), dict(frequency_penalty=2.0), dict(logit_bias={int(top[0][0]): -9.0}),
               dict(min_tokens=64, max_tokens=64)]
    # a grammar's bitmask that forbids each row's two likeliest tokens
    from autoglm_serve.structured.matcher import bitmask_width
    forbid = torch.full((B, bitmask_width(V)), -1, dtype=torch.int32)
    for i, row in enumerate(top):
        for t in row[:2]:
            forbid[i, t // 32] &= ~(1 << (t % 32))
    for extra in changed + ["bitmask"]:
        varied = [replace(p, **extra) if p.temperature and extra != "bitmask" else p
                  for p in params]
        bitmask = forbid if extra == "bitmask" else None

        def rows():
            return [SamplingRow(p, [], top[i][:32], make_generator(p.seed, "cpu")
                                if p.seed is not None else None, eos_token_ids=top[i][:2])
                    for i, p in enumerate(varied)]
        tokens = Sampler().sample(raw, rows(), bitmask=bitmask).sampled_token_ids
        as_float32 = Sampler().sample(raw.float(), rows(), bitmask=bitmask).sampled_token_ids
        assert torch.equal(tokens, as_float32), extra


def test_bf16_logits_accepted():
    logits = torch.tensor([[0.5, 2.0, 1.0]], dtype=torch.bfloat16)
    out = Sampler()(logits, batch_of([SamplingParams(temperature=0)], 3))
    assert out.sampled_token_ids.tolist() == [1]


def test_sampler_leaves_caller_logits_untouched():
    logits = torch.tensor([[0.5, 2.0, 1.0, -1.0]])
    before = logits.clone()
    Sampler()(logits, batch_of([SamplingParams(top_k=2, top_p=0.5, min_p=0.2, min_tokens=3,
                                               repetition_penalty=1.5)], 4,
                               prompts=[[1]], eos=[0]))
    assert torch.equal(logits, before)


# ---------------------------------------------------------------- seeds and distribution

def seeded_run(seed, steps, logits_row, position, others):
    """Samples `steps` tokens for a seeded row sitting at `position` among `others` rows."""
    gen = make_generator(seed, "cpu")
    params = [SamplingParams(seed=seed if i == position else None) for i in range(others + 1)]
    tokens = []
    for _ in range(steps):
        logits = torch.randn(others + 1, logits_row.numel())  # other rows change every step
        logits[position] = logits_row
        gens = [gen if i == position else None for i in range(others + 1)]
        out = Sampler()(logits, batch_of(params, logits_row.numel(), generators=gens))
        tokens.append(out.sampled_token_ids[position].item())
    return tokens


def test_seeded_row_reproducible_whatever_the_batch():
    flat = torch.zeros(1000)  # uniform: any RNG leak would show up at once
    alone = seeded_run(1234, 20, flat, position=0, others=0)
    assert alone == seeded_run(1234, 20, flat, position=0, others=0)
    torch.manual_seed(7)
    assert alone == seeded_run(1234, 20, flat, position=2, others=4)
    torch.manual_seed(8)
    assert alone == seeded_run(1234, 20, flat, position=0, others=1)


def test_seeded_row_with_seeded_neighbours():
    flat = torch.zeros(500)
    alone = seeded_run(5, 10, flat, position=0, others=0)
    g_other, g_me = make_generator(99, "cpu"), make_generator(5, "cpu")
    params = [SamplingParams(seed=99), SamplingParams(seed=5)]
    got = []
    for _ in range(10):
        out = Sampler()(torch.zeros(2, 500), batch_of(params, 500, generators=[g_other, g_me]))
        got.append(out.sampled_token_ids[1].item())
    assert got == alone


def test_different_seeds_differ():
    flat = torch.zeros(1000)
    a = seeded_run(1, 30, flat, position=0, others=0)
    b = seeded_run(2, 30, flat, position=0, others=0)
    assert a != b
    assert len(set(a)) > 20  # and a single seed does not repeat itself


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_batched_draw_frequencies_match_probs(temperature):
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    target = probs ** (1 / temperature)
    target = target / target.sum()
    N = 20000
    torch.manual_seed(2024)
    out = Sampler()(probs.log().float().expand(N, 4).contiguous(),
                    batch_of([SamplingParams(temperature=temperature)] * N, 4))
    freq = torch.bincount(out.sampled_token_ids, minlength=4).double() / N
    # 4 standard errors at N=20000 is < 0.015; the seed is fixed, so this cannot flake
    assert torch.allclose(freq, target, atol=0.015), (freq, target)


def test_seeded_draw_frequencies_match_probs():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    gen = make_generator(3, "cpu")
    logits = probs.log().float()[None]
    batch = batch_of([SamplingParams(seed=3)], 4, generators=[gen])
    N = 4000
    draws = torch.stack([Sampler()(logits, batch).sampled_token_ids[0] for _ in range(N)])
    freq = torch.bincount(draws, minlength=4).double() / N
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_top_k_top_p_restrict_random_draws():
    probs = [0.4, 0.3, 0.2, 0.1]
    logits = torch.tensor([[math.log(p) for p in probs]] * 3000)
    torch.manual_seed(5)
    params = [SamplingParams(top_k=2)] * 1000 + [SamplingParams(top_p=0.65)] * 1000 \
        + [SamplingParams(top_k=3, top_p=0.95)] * 1000
    out = Sampler()(logits, batch_of(params, 4)).sampled_token_ids
    assert set(out[:1000].tolist()) == {0, 1}
    assert set(out[1000:2000].tolist()) == {0, 1}
    assert set(out[2000:].tolist()) == {0, 1, 2}


# ---------------------------------------------------------------- logprobs

def test_logprobs_from_raw_logits_with_ranks():
    raw = torch.tensor([[3.0, 2.0, 1.0, 0.0, 2.0], [0.0, 1.0, 4.0, 2.0, -1.0],
                        [1.0, 1.0, 1.0, 1.0, 1.0]])
    params = [SamplingParams(temperature=0, repetition_penalty=10.0, logprobs=3),
              SamplingParams(temperature=0, logprobs=0),
              SamplingParams(temperature=0)]
    out = Sampler()(raw, batch_of(params, 5, prompts=[[0], [], []]))
    # row 0: penalty makes token 0 0.3, so argmax is token 1 (first of the tie 1/4 at 2.0)
    assert out.sampled_token_ids.tolist() == [1, 2, 0]
    lp = out.logprobs
    assert lp is not None and lp.top_logprobs.shape == (3, 3)
    expected = torch.log_softmax(raw.double(), dim=-1)  # raw: no penalty in the values
    assert torch.allclose(lp.sampled_logprobs.double(),
                          expected[[0, 1, 2], [1, 2, 0]], atol=1e-6)
    # rank = 1 + tokens strictly more likely: token 1 trails only token 0 (4 ties with it)
    assert lp.sampled_ranks.tolist() == [2, 1, 1]
    assert lp.top_token_ids[0, 0].item() == 0 and set(lp.top_token_ids[0, 1:].tolist()) == {1, 4}
    assert lp.top_token_ids[1].tolist() == [2, 3, 1]
    assert torch.allclose(lp.top_logprobs.double(),
                          expected.gather(1, lp.top_token_ids), atol=1e-6)
    assert batch_of(params, 5).num_logprobs == [3, 0, None]


def test_logprobs_rank_of_random_sample():
    torch.manual_seed(0)
    raw = torch.randn(64, 30)
    out = Sampler()(raw, batch_of([SamplingParams(temperature=1.5, logprobs=2)] * 64, 30))
    lp = torch.log_softmax(raw.double(), -1)
    tok = out.sampled_token_ids
    for i in range(64):
        own = lp[i, tok[i]]
        assert out.logprobs.sampled_ranks[i].item() == 1 + int((lp[i] > own).sum())
        assert abs(out.logprobs.sampled_logprobs[i].item() - own.item()) < 1e-6


def test_no_logprobs_when_nobody_asks():
    assert sample([1.0, 2.0], [SamplingParams()]).logprobs is None


# ---------------------------------------------------------------- device (no host syncs)

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_step_has_no_host_sync_and_is_seed_stable():
    V = 151_552
    params = [SamplingParams(temperature=0.7, top_p=0.9, top_k=50, min_p=0.05, seed=11,
                             repetition_penalty=1.1, frequency_penalty=0.2, logprobs=5,
                             min_tokens=4),
              SamplingParams(temperature=0), SamplingParams(top_k=20)]
    rows = lambda gen: [SamplingRow(p, [1, 2, 3], [4, 5], gen if i == 0 else None, [0])  # noqa: E731
                        for i, p in enumerate(params)]
    logits = torch.randn(3, V, device="cuda", dtype=torch.bfloat16)
    batch = SamplingBatch.build(rows(make_generator(11, "cuda")), V, "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = Sampler()(logits, batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    alone = Sampler()(logits[:1], SamplingBatch.build(rows(make_generator(11, "cuda"))[:1], V,
                                                      "cuda"))
    assert out.sampled_token_ids[0].item() == alone.sampled_token_ids[0].item()
    assert out.sampled_token_ids[1].item() == logits[1].float().argmax().item()


def test_row_groups_follow_the_memory_the_engine_may_use():
    """The sampler's peak (about 48 bytes an element of a group, every option on) stays within
    1/64 of the engine's memory: the largest groups on an 80 GB card, 27 GLM rows on a 24 GB
    one, never fewer than 2^20 elements."""
    from autoglm_serve.engine.core.sampler import group_elements_for
    h100, card_24gb = 0.9 * 79.2 * 2**30, 0.9 * 23.5 * 2**30
    assert group_elements_for(h100) == 1 << 24
    assert group_elements_for(0.9 * 44.4 * 2**30) == 1 << 23
    assert group_elements_for(card_24gb) == 1 << 22
    assert group_elements_for(2**30) == 1 << 20
    for memory in (h100, card_24gb, 6 * 2**30):
        assert group_elements_for(memory) * 48 <= memory / 64


def test_rows_sampled_in_groups_equal_one_batch():
    """Sampler.sample splits the rows into groups to bound its buffers: greedy rows, seeded
    rows and logprobs (of different widths per group) come out as from one batch."""
    V, B = 64, 11
    torch.manual_seed(0)
    logits = torch.randn(B, V)
    params = [SamplingParams(temperature=0, logprobs=3 if i % 4 == 0 else None) if i % 2 else
              SamplingParams(seed=100 + i, top_p=0.9, frequency_penalty=0.5,
                             logprobs=5 if i == 2 else None)
              for i in range(B)]

    def rows():
        return [SamplingRow(p, [1, 2, 3], [4, 4], make_generator(p.seed, "cpu")
                            if p.seed is not None else None) for p in params]

    whole = Sampler()(logits, SamplingBatch.build(rows(), V, "cpu"))
    grouped = Sampler(group_elements=4 * V).sample(logits, rows())     # groups of 4 rows
    assert torch.equal(grouped.sampled_token_ids, whole.sampled_token_ids)
    got, want = grouped.logprobs, whole.logprobs
    for i, p in enumerate(params):
        if p.logprobs is None:
            continue
        k = p.logprobs
        assert got.sampled_logprobs[i] == want.sampled_logprobs[i]
        assert got.sampled_ranks[i] == want.sampled_ranks[i]
        assert torch.equal(got.top_token_ids[i, :k], want.top_token_ids[i, :k])
        assert torch.equal(got.top_logprobs[i, :k], want.top_logprobs[i, :k])


def test_bitmask_and_logit_bias():
    """Bit t of a row's bitmask allows token t; logit_bias adds to the logit before it."""
    from autoglm_serve.structured.bitmask import apply_bitmask
    from autoglm_serve.structured.matcher import bitmask_width
    V = 70
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, V, generator=g)
    allowed = torch.rand(3, V, generator=g) < 0.3
    allowed[:, 5] = True
    bits = torch.zeros(3, bitmask_width(V) * 32, dtype=torch.int64)
    bits[:, :V] = allowed.long()
    words = (bits.view(3, -1, 32) << torch.arange(32)).sum(-1)
    mask = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    got = apply_bitmask(logits.clone(), mask)
    assert torch.equal(got.isinf(), ~allowed)
    assert torch.equal(got[allowed], logits[allowed])
    # through the sampler: a +100 bias forces token 5 (allowed), a masked token never wins
    rows = [SamplingRow(SamplingParams(temperature=1.0, logit_bias={5: 100.0}), [], [])
            for _ in range(3)]
    out = Sampler().sample(logits, rows, bitmask=mask)
    assert out.sampled_token_ids.tolist() == [5, 5, 5]
    rows = [SamplingRow(SamplingParams(temperature=0.0), [], []) for _ in range(3)]
    tokens = Sampler().sample(logits, rows, bitmask=mask).sampled_token_ids.tolist()
    assert tokens == logits.masked_fill(~allowed, float("-inf")).argmax(-1).tolist()

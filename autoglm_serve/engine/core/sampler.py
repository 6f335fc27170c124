"""Batched sampler: logits [B, V] -> one next token per row (+ logprobs), on the logits' device.

Processing order (as vLLM): the grammar's bitmask (structured outputs), logit_bias,
min_tokens mask, repetition penalty, frequency/presence penalties,
(greedy argmax here), temperature, top-k, top-p, min-p, then an exponential race.

The step path (`Sampler.__call__`) has no host syncs: every per-row choice is a tensor op over
the whole batch. The Python-side decisions (does any row use top-p? how many logprobs?) are
made once per step in `SamplingBatch.build`, from params that live on the host anyway.

Logprobs are taken from log_softmax of the RAW logits, before penalties, temperature and
masks. That is vLLM's default ("raw_logprobs"): clients see the model's distribution, which
does not change with their sampling knobs, and masked tokens keep a finite logprob.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import chain

import torch

from autoglm_serve.engine.core.token_counts import token_counts
from autoglm_serve.host_transfer import to_device
from autoglm_serve.sampling_params import SamplingParams
from autoglm_serve.structured.bitmask import apply_bitmask

# exponential_ may return exactly 0 (u == 0); p / 0 would be inf or NaN, and argmax favours NaN.
_TINY = torch.finfo(torch.float32).tiny
# Rows are sampled in groups of at most group_elements elements per [rows, V] buffer: the
# sampler builds about ten such buffers (copy, penalties, the top-p sort's values and indices,
# softmax, cumsum), 1.6 GiB at 256 rows of GLM's 151k vocabulary in one group, which a 24 GB
# card cannot spare; the start-up memory plan reserves the peak beside the KV cache. Smaller
# groups cost device time where rows sample with top-p (a sort a group: 256 such rows took
# 6.6 ms of kernels in groups of 2^24 elements, 9.6 ms in groups of 2^22 on an H100), so the
# group is sized to the memory the engine may use. Rows are independent: grouping changes no
# token.
_PEAK_BYTES_PER_ELEMENT = 48      # every option and logprobs: 188 MiB at 2^22, 766 at 2^24
DEFAULT_GROUP_ELEMENTS = 1 << 22  # 27 GLM rows


def group_elements_for(memory_bytes: float) -> int:
    """The largest power of two of elements, 2^20 to 2^24, whose peak is at most 1/64 of the
    memory the engine may use: 2^24 on an 80 GB card, 2^22 on a 24 GB one."""
    elements = 1 << 24
    while elements > 1 << 20 and elements * _PEAK_BYTES_PER_ELEMENT > memory_bytes / 64:
        elements //= 2
    return elements


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A per-request generator; it must live on the logits' device to draw there. The seed is
    taken modulo 2^64 (torch's range), so the n children's seed + i never overflow it."""
    return torch.Generator(device=device).manual_seed(seed % 2**64)


@dataclass
class SamplingRow:
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None   # set for seeded requests
    eos_token_ids: Collection[int] = ()
    num_inflight: int = 0     # its tokens sampled on the device, not yet in output_token_ids


@dataclass
class SamplingBatch:
    """Per-step sampling state of a batch, as device tensors plus host-side flags."""
    num_rows: int
    vocab_size: int
    temperature: torch.Tensor         # float32 [B]; 1.0 on greedy rows so the division is a no-op
    top_p: torch.Tensor               # float32 [B]; 1.0 = off
    min_p: torch.Tensor               # float32 [B]; 0.0 = off
    repetition_penalty: torch.Tensor  # float32 [B]; 1.0 = off
    frequency_penalty: torch.Tensor   # float32 [B]
    presence_penalty: torch.Tensor    # float32 [B]
    top_k: torch.Tensor               # int64 [B] in [1, V]; V = off
    is_greedy: torch.Tensor           # bool [B]
    all_greedy: bool
    any_greedy: bool
    any_top_k: bool
    all_top_k: bool                   # every random row has top-k: top-p needs no full sort
    any_top_p: bool
    any_min_p: bool
    any_repetition_penalty: bool
    any_frequency_presence: bool
    max_top_k: int                    # largest k of the rows using top-k (topk size)
    prompt_mask: torch.Tensor | None    # bool [B, V]: token in the prompt (repetition penalty)
    output_counts: torch.Tensor | None  # float32 [B, V]: occurrences in the output so far
    min_tokens_banned: torch.Tensor | None  # int64 [N]: row * V + token, banned by min_tokens
    bitmask: torch.Tensor | None = None      # int32 [B, W]: allowed tokens (structured outputs)
    bias_index: torch.Tensor | None = None   # int64 [N]: row * V + token, with a logit_bias...
    bias_value: torch.Tensor | None = None   # float32 [N]: ...of this value
    generators: dict[int, torch.Generator] = field(default_factory=dict)  # row -> own RNG
    num_logprobs: list[int | None] = field(default_factory=list)  # per row, as requested
    max_num_logprobs: int | None = None   # None = no row wants logprobs

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int, device: torch.device | str,
              history: tuple[torch.Tensor, torch.Tensor | None] | None = None,
              bitmask: torch.Tensor | None = None) -> SamplingBatch:
        """history: the rows' (output counts [B, V], prompt mask [B, V] or None) as the device
        keeps them (engine/core/token_counts.py); without it they are built from the rows'
        host lists, which must then hold every earlier token. bitmask: int32 [B, W] on the
        host, the grammars' allowed tokens (-1: all)."""
        device = torch.device(device)
        V = vocab_size
        params = [r.params for r in rows]
        greedy = [p.greedy for p in params]
        random_params = [p for p, g in zip(params, greedy) if not g]
        # k >= V keeps everything; clamping lets "off" be V and keeps gather indices in range.
        top_k = [min(p.top_k, V) if p.top_k > 0 and not g else V for p, g in zip(params, greedy)]
        k_in_use = [k for k in top_k if k < V]
        rep_rows = [p.repetition_penalty != 1.0 for p in params]
        fp_rows = [p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params]

        # One host->device copy for all the float columns.
        floats = torch.tensor([
            [1.0 if g else p.temperature for p, g in zip(params, greedy)],
            [p.top_p for p in params],
            [p.min_p for p in params],
            [p.repetition_penalty for p in params],
            [p.frequency_penalty for p in params],
            [p.presence_penalty for p in params],
        ], dtype=torch.float32).reshape(6, len(rows))
        floats = to_device(floats, torch.float32, device)

        any_rep, any_fp = any(rep_rows), any(fp_rows)
        prompt_mask = output_counts = None
        if history is not None and (any_rep or any_fp):
            output_counts, prompt_mask = history
        else:
            if any_rep:
                prompt_mask = token_counts(
                    [r.prompt_token_ids if u else () for r, u in zip(rows, rep_rows)], V,
                    device) > 0
            if any_rep or any_fp:
                output_counts = token_counts(
                    [r.output_token_ids if u or v else ()
                     for r, u, v in zip(rows, rep_rows, fp_rows)], V, device)

        banned: list[int] = []
        for i, r in enumerate(rows):
            if len(r.output_token_ids) + r.num_inflight < r.params.min_tokens:
                ids = {t for t in chain(r.eos_token_ids, r.params.stop_token_ids) if 0 <= t < V}
                banned += [i * V + t for t in sorted(ids)]

        generators: dict[int, torch.Generator] = {}
        for i, (r, g) in enumerate(zip(rows, greedy)):
            if r.generator is not None and not g:
                if r.generator.device.type != device.type:
                    raise ValueError(f"row {i}: generator on {r.generator.device}, logits on {device}")
                generators[i] = r.generator

        if bitmask is not None:
            bitmask = to_device(bitmask, torch.int32, device)
        bias_index: list[int] = []
        bias_value: list[float] = []
        for i, p in enumerate(params):
            for t, b in (p.logit_bias or {}).items():
                if 0 <= t < V:      # ids past the vocabulary have no logit to bias
                    bias_index.append(i * V + t)
                    bias_value.append(b)

        num_logprobs = [p.logprobs for p in params]
        asked = [n for n in num_logprobs if n is not None]
        return cls(
            num_rows=len(rows), vocab_size=V,
            temperature=floats[0], top_p=floats[1], min_p=floats[2],
            repetition_penalty=floats[3], frequency_penalty=floats[4], presence_penalty=floats[5],
            top_k=to_device(top_k, torch.int64, device),
            is_greedy=to_device(greedy, torch.bool, device),
            all_greedy=all(greedy), any_greedy=any(greedy),
            any_top_k=bool(k_in_use),
            all_top_k=bool(random_params) and len(k_in_use) == len(random_params),
            any_top_p=any(p.top_p < 1.0 for p in random_params),
            any_min_p=any(p.min_p > 0.0 for p in random_params),
            any_repetition_penalty=any_rep, any_frequency_presence=any_fp,
            max_top_k=max(k_in_use, default=V),
            prompt_mask=prompt_mask, output_counts=output_counts,
            min_tokens_banned=(to_device(banned, torch.int64, device)
                               if banned else None),
            bitmask=bitmask,
            bias_index=to_device(bias_index, torch.int64, device) if bias_index else None,
            bias_value=to_device(bias_value, torch.float32, device) if bias_index else None,
            generators=generators, num_logprobs=num_logprobs,
            max_num_logprobs=max(asked) if asked else None,
        )


@dataclass
class LogprobsTensors:
    sampled_logprobs: torch.Tensor  # float32 [B]: logprob of the sampled token
    sampled_ranks: torch.Tensor     # int64 [B]: 1 + number of tokens strictly more likely
    top_token_ids: torch.Tensor     # int64 [B, K], K = max_num_logprobs, most likely first
    top_logprobs: torch.Tensor      # float32 [B, K]; row i uses its first num_logprobs[i]


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # int64 [B]
    logprobs: LogprobsTensors | None


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of each row. On a CPU through max(), which is vectorized there and argmax is
    not (16 x 49,152 bf16 logits: 0.54 against 2.5 ms); both take the first of tied maxima."""
    if logits.device.type == "cpu":
        return logits.max(dim=-1).indices
    return logits.argmax(dim=-1)


def apply_min_tokens(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    # index_fill_ takes a Python scalar; index_put_ would need a value tensor copied from the host.
    if batch.min_tokens_banned is not None:
        logits.view(-1).index_fill_(0, batch.min_tokens_banned, float("-inf"))
    return logits


def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    if batch.output_counts is None:
        return logits
    counts = batch.output_counts
    occurred = counts > 0
    if batch.any_repetition_penalty:
        # HF/vLLM: dividing a positive logit and multiplying a negative one both push it down.
        rep = batch.repetition_penalty[:, None]
        seen = occurred | batch.prompt_mask
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
    if batch.any_frequency_presence:
        logits = logits - batch.frequency_penalty[:, None] * counts
        logits = logits - batch.presence_penalty[:, None] * occurred
    return logits


def apply_top_k_top_p(logits: torch.Tensor, batch: SamplingBatch,
                      raw: torch.Tensor | None = None) -> torch.Tensor:
    """Masks by per-row value cutoffs, so tokens tied with the last kept one are all kept.
    raw: the model's logits when ``logits`` is exactly them in float32 over the temperature
    (nothing else applied), which the full sort may then read instead."""
    V = logits.shape[-1]
    neg_inf = float("-inf")
    if not batch.any_top_p:
        # top-k alone: a topk of the largest k asked is much cheaper than sorting the vocabulary.
        values = logits.topk(batch.max_top_k, dim=-1).values  # descending
        index = (batch.top_k.clamp(max=batch.max_top_k) - 1)[:, None]
        cutoff = values.gather(1, index)
        cutoff.masked_fill_(batch.top_k[:, None] > batch.max_top_k, neg_inf)  # rows with top-k off
        return logits.masked_fill_(logits < cutoff, neg_inf)

    if batch.all_top_k:
        return _top_k_then_top_p_on_topk(logits, batch)

    if raw is not None and raw.element_size() < logits.element_size():
        # The same order and, scaled as logits was, the same values: sorting bf16 keys takes
        # half the radix passes of float32's.
        ascending = raw.sort(dim=-1).values.to(logits.dtype).div_(batch.temperature[:, None])
    else:
        ascending = logits.sort(dim=-1).values
    cutoff = torch.full((logits.shape[0], 1), neg_inf, device=logits.device)
    if batch.any_top_k:
        cutoff = ascending.gather(1, (V - batch.top_k)[:, None])
        ascending = ascending.masked_fill(ascending < cutoff, neg_inf)
    # Ascending cumulative mass: a token is dropped when it and every smaller one together
    # hold <= 1 - top_p, i.e. the larger tokens alone already reach top_p.
    cum = ascending.softmax(dim=-1).cumsum(dim=-1)
    dropped = (cum <= (1 - batch.top_p)[:, None]).sum(dim=-1)
    dropped = dropped.clamp_(max=V - 1)                    # keep at least the most likely token
    dropped = dropped.masked_fill_(batch.top_p >= 1.0, 0)  # top_p 1 keeps all, despite rounding
    cutoff = torch.maximum(cutoff, ascending.gather(1, dropped[:, None]))
    return logits.masked_fill_(logits < cutoff, neg_inf)


def _top_k_then_top_p_on_topk(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Top-p over the k largest values only: a topk instead of a full-vocabulary sort.

    Same rule as the sort path, from the top: keep a token while the mass before it is < top_p.
    One difference: tokens tied with the k-th value beyond k count in the kept set but not
    in the top-p mass; the sort path counts them in both.
    """
    K = batch.max_top_k
    values = logits.topk(K, dim=-1).values                       # descending [B, K]
    k = batch.top_k.clamp(max=K)[:, None]
    in_k = torch.arange(K, device=logits.device)[None, :] < k
    probs = values.masked_fill(~in_k, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    kept = ((mass_before < batch.top_p[:, None]) & in_k).sum(dim=-1, keepdim=True).clamp_(min=1)
    kept = torch.where(batch.top_p[:, None] >= 1.0, k, kept)   # top_p 1 keeps all k
    cutoff = values.gather(1, kept - 1)   # kept <= k, so this also applies top-k
    return logits.masked_fill_(logits < cutoff, float("-inf"))


def apply_min_p(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    # p < min_p * p_max  <=>  logit < logit_max + log(min_p): no softmax needed; log(0) = -inf.
    cutoff = logits.amax(dim=-1, keepdim=True) + batch.min_p.log()[:, None]
    return logits.masked_fill_(logits < cutoff, float("-inf"))


def compute_logprobs(raw_logits: torch.Tensor, sampled: torch.Tensor,
                     num_top: int) -> LogprobsTensors:
    logprobs = raw_logits.float().log_softmax(dim=-1)
    sampled_lp = logprobs.gather(1, sampled[:, None])
    ranks = (logprobs > sampled_lp).sum(dim=-1) + 1
    top_lp, top_ids = logprobs.topk(num_top, dim=-1)
    return LogprobsTensors(sampled_logprobs=sampled_lp.squeeze(1), sampled_ranks=ranks,
                           top_token_ids=top_ids, top_logprobs=top_lp)


def _concat(parts: list[SamplerOutput]) -> SamplerOutput:
    """Row groups' outputs as one; logprob columns padded to the widest group's."""
    tokens = torch.cat([p.sampled_token_ids for p in parts])
    with_lp = [p.logprobs for p in parts if p.logprobs is not None]
    if not with_lp:
        return SamplerOutput(tokens, None)
    k = max(lp.top_token_ids.shape[1] for lp in with_lp)
    device = tokens.device

    def padded(p: SamplerOutput) -> LogprobsTensors:
        n = p.sampled_token_ids.shape[0]
        lp = p.logprobs or LogprobsTensors(       # a group where no row asked: placeholders
            torch.zeros(n, device=device), torch.zeros(n, dtype=torch.int64, device=device),
            torch.zeros(n, 0, dtype=torch.int64, device=device), torch.zeros(n, 0, device=device))
        pad = k - lp.top_token_ids.shape[1]
        return LogprobsTensors(lp.sampled_logprobs, lp.sampled_ranks,
                               torch.nn.functional.pad(lp.top_token_ids, (0, pad)),
                               torch.nn.functional.pad(lp.top_logprobs, (0, pad),
                                                       value=float("-inf")))

    lps = [padded(p) for p in parts]
    return SamplerOutput(tokens, LogprobsTensors(
        torch.cat([lp.sampled_logprobs for lp in lps]), torch.cat([lp.sampled_ranks for lp in lps]),
        torch.cat([lp.top_token_ids for lp in lps]), torch.cat([lp.top_logprobs for lp in lps])))


class Sampler:
    def __init__(self, group_elements: int = DEFAULT_GROUP_ELEMENTS):
        self.group_elements = group_elements

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow],
               history: tuple[torch.Tensor, torch.Tensor | None] | None = None,
               bitmask: torch.Tensor | None = None) -> SamplerOutput:
        """The rows' next tokens, in groups that bound the sampler's memory (history and
        bitmask: see SamplingBatch.build)."""
        V = logits.shape[-1]
        group = max(1, self.group_elements // V)
        if len(rows) <= group:
            return self(logits, SamplingBatch.build(rows, V, logits.device, history, bitmask))

        def part(i):
            if history is None:
                return None
            counts, mask = history
            return counts[i:i + group], (mask[i:i + group] if mask is not None else None)
        return _concat([self(logits[i:i + group],
                             SamplingBatch.build(rows[i:i + group], V, logits.device, part(i),
                                                 bitmask[i:i + group]
                                                 if bitmask is not None else None))
                        for i in range(0, len(rows), group)])

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        # Work on a float32 copy: the raw logits stay intact for logprobs and for the caller.
        x = logits.to(torch.float32, copy=True)
        if batch.bias_index is not None:
            x.view(-1).index_add_(0, batch.bias_index, batch.bias_value)
        if batch.bitmask is not None:
            x = apply_bitmask(x, batch.bitmask)
        x = apply_min_tokens(x, batch)
        x = apply_penalties(x, batch)
        greedy = greedy_tokens(x) if batch.any_greedy else None
        if batch.all_greedy:
            tokens = greedy
        else:
            unchanged = (batch.bias_index is None and batch.bitmask is None
                         and batch.min_tokens_banned is None and batch.output_counts is None)
            tokens = self._sample_random(x, batch, logits if unchanged else None)
            if greedy is not None:
                tokens = torch.where(batch.is_greedy, greedy, tokens)
        logprobs = None
        if batch.max_num_logprobs is not None:
            logprobs = compute_logprobs(logits, tokens, batch.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=tokens, logprobs=logprobs)

    @staticmethod
    def _sample_random(x: torch.Tensor, batch: SamplingBatch,
                       raw: torch.Tensor | None) -> torch.Tensor:
        """raw: the model's logits where x is still exactly them in float32."""
        x = x.div_(batch.temperature[:, None])
        if batch.any_top_k or batch.any_top_p:
            x = apply_top_k_top_p(x, batch, raw)
        if batch.any_min_p:
            x = apply_min_p(x, batch)
        probs = x.softmax(dim=-1)
        # Exponential race: argmax(p / q) with q ~ Exp(1) is a draw from p, without a cumsum or
        # a host sync. A seeded row draws its whole q row from its own generator, so its tokens
        # do not depend on which other rows share the batch or where it sits.
        q = torch.empty_like(probs)
        if len(batch.generators) < batch.num_rows:
            q.exponential_()
        for row, gen in batch.generators.items():
            q[row].exponential_(generator=gen)
        return probs.div_(q.clamp_min_(_TINY)).argmax(dim=-1)

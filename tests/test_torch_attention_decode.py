"""The torch backend's decode against plain SDPA over each sequence's own K and V: the gathered
batch (short contexts) and the in-place read of long CPU contexts, whose blocks come in runs
(as the allocator hands them out after frees) or scattered (the gathered fallback), in the
CPU's heads-first cache and in the GPU's contiguous one."""
import pytest
import torch
import torch.nn.functional as F

from autoglm_serve.models.layers.attention import new_kv_cache
from autoglm_serve.models.layers.torch_attention import (IN_PLACE_MIN_TOKENS, MAX_RUNS,
                                                         _block_runs, _decode, _decode_plan)

NUM_BLOCKS, HKV, BS, D, GROUP = 700, 2, 16, 32, 4
SCALE = D ** -0.5


def reference(q, cache, tables, seq_lens):
    out = []
    for i, n in enumerate(seq_lens):
        if n == 0:
            out.append(torch.zeros_like(q[i]))
            continue
        blocks = tables[i, :-(-n // BS)].long()
        k = cache[0, blocks].transpose(1, 2).reshape(-1, HKV, D)[:n].transpose(0, 1)
        v = cache[1, blocks].transpose(1, 2).reshape(-1, HKV, D)[:n].transpose(0, 1)
        o = F.scaled_dot_product_attention(q[i].unsqueeze(1), k.repeat_interleave(GROUP, 0),
                                           v.repeat_interleave(GROUP, 0), scale=SCALE)
        out.append(o.squeeze(1))
    return torch.stack(out)


def table(kind: str, num: int, gen: torch.Generator) -> list[int]:
    if kind == "scattered":
        return torch.randperm(NUM_BLOCKS, generator=gen)[:num].tolist()
    if kind == "one run":
        return list(range(9, 9 + num))
    ids = list(range(50, 50 + num))               # freed tail-first: runs in reverse order
    chunk = -(-num // 5)
    return [b for part in reversed([ids[i:i + chunk] for i in range(0, num, chunk)])
            for b in part]


@pytest.mark.parametrize("layout", ["heads first", "contiguous"])
@pytest.mark.parametrize("kind", ["runs", "one run", "scattered"])
@pytest.mark.parametrize("seq_lens", [[IN_PLACE_MIN_TOKENS + 1], [3000, 0, 700], [17, 1200],
                                      [5, 100, 16], [5, 0, 33]])
def test_decode_matches_sdpa(layout, kind, seq_lens):
    gen = torch.Generator().manual_seed(len(seq_lens) * 7 + seq_lens[0])
    cache = new_kv_cache(NUM_BLOCKS, HKV, BS, D, torch.float32, torch.device("cpu"))
    if layout == "contiguous":
        cache = cache.contiguous()
    cache.copy_(torch.randn(cache.shape, generator=gen))
    width = max(-(-n // BS) for n in seq_lens) + 2
    tables = torch.tensor([table(kind, width, gen) for _ in seq_lens], dtype=torch.int32)
    q = torch.randn(len(seq_lens), HKV * GROUP, D, generator=gen)
    got = _decode(q, cache, _decode_plan(tables, seq_lens, cache, q.dtype), GROUP,
                  SCALE)
    torch.testing.assert_close(got, reference(q, cache, tables, seq_lens), atol=2e-5,
                               rtol=1e-4)


def test_block_runs():
    assert _block_runs([7, 8, 9, 3, 4, 12]) == [(7, 3), (3, 2), (12, 1)]
    assert len(_block_runs(list(range(0, 2 * (MAX_RUNS + 1), 2)))) == MAX_RUNS + 1

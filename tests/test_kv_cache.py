"""KVCacheManager bookkeeping: all-or-nothing allocation, shared prefix blocks, LRU eviction."""
import torch

from autoglm_serve.engine.core.kv_cache import KVCacheManager
from autoglm_serve.engine.core.request import Request
from autoglm_serve.multimodal.inputs import MultiModalItem
from autoglm_serve.sampling_params import SamplingParams

BS = 4


def make_request(rid: str, tokens: list[int], mm_items=()) -> Request:
    return Request(rid, list(tokens), SamplingParams(), frozenset(), max_tokens=16,
                   mm_items=list(mm_items))


def compute(kv: KVCacheManager, req: Request) -> None:
    """Allocates and 'computes' the whole prompt, then offers its blocks to the prefix cache."""
    cached = kv.find_cached_prefix(req)
    assert kv.allocate(req, req.num_tokens - len(cached) * BS, cached)
    req.num_computed_tokens = req.num_tokens
    kv.cache_computed_blocks(req)


def test_allocate_is_all_or_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    a, b = make_request("a", range(10)), make_request("b", range(100, 108))
    assert kv.allocate(a, 10)
    assert len(a.block_ids) == 3 and kv.num_free_blocks == 1
    assert not kv.allocate(b, 8)            # needs 2 blocks, 1 is free
    assert b.block_ids == [] and kv.num_free_blocks == 1
    assert kv.allocate(b, 4)                # 1 block fits
    assert kv.num_free_blocks == 0 and kv.usage == 1.0
    # growing by tokens that still fit in the last block needs no new block
    a.num_computed_tokens = 10
    assert kv.allocate(a, 2) and len(a.block_ids) == 3
    assert not kv.allocate(a, 3)            # token 13 would need a 4th block
    assert len(a.block_ids) == 3


def test_shared_prefix_blocks_are_reference_counted():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    a = make_request("a", list(range(9)))                # blocks: [0..3] [4..7] [8]
    compute(kv, a)
    b = make_request("b", list(range(8)) + [50, 51, 52])
    cached = kv.find_cached_prefix(b)
    assert cached == a.block_ids[:2]
    assert kv.allocate(b, b.num_tokens - 8, cached)
    assert b.block_ids[:2] == a.block_ids[:2]
    assert [kv.ref_counts[x] for x in cached] == [2, 2]
    assert kv.num_free_blocks == 8 - 3 - 1              # a: 3 blocks, b: 1 block of its own
    kv.free(a)
    assert [kv.ref_counts[x] for x in cached] == [1, 1]
    assert not any(x in kv.free_queue for x in cached)   # still in use by b
    kv.free(b)
    assert kv.num_free_blocks == kv.num_blocks
    # free but still cached: an identical prompt finds them
    c = make_request("c", list(range(9)))
    assert kv.find_cached_prefix(c) == cached


def test_a_fully_cached_prompt_still_leaves_one_token_to_compute():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    compute(kv, make_request("a", list(range(8))))
    # the same 8 tokens: 2 full blocks are cached, but the last token must run to give logits
    assert len(kv.find_cached_prefix(make_request("b", list(range(8))))) == 1
    assert len(kv.find_cached_prefix(make_request("c", list(range(9))))) == 2


def test_different_prompts_never_share_and_sharing_stops_at_first_difference():
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    compute(kv, make_request("a", list(range(13))))
    assert kv.find_cached_prefix(make_request("b", [99] + list(range(1, 13)))) == []
    # same first block, different second: only the first is shared; the third block has the
    # same tokens as a's but a different parent, so it does not match either
    c = make_request("c", list(range(4)) + [99] + list(range(5, 13)))
    assert len(kv.find_cached_prefix(c)) == 1


def test_free_puts_tails_first_so_shared_prefixes_are_evicted_last():
    kv = KVCacheManager(num_blocks=6, block_size=BS)
    old = make_request("old", list(range(100, 104)) + [0])
    compute(kv, old)
    old_blocks = list(old.block_ids)
    kv.free(old)
    a = make_request("a", list(range(12)))
    compute(kv, a)
    a_blocks = list(a.block_ids)
    assert not set(a_blocks) & set(old_blocks)   # unused blocks were taken before cached ones
    kv.free(a)
    order = list(kv.free_queue)
    # a's blocks at the end, its tail before its prefix; old's (freed earlier) before them
    assert order[-3:] == list(reversed(a_blocks))
    assert max(order.index(b) for b in old_blocks) < order.index(a_blocks[-1])
    # a new request takes the least recently freed blocks
    x = make_request("x", list(range(200, 208)))
    assert kv.allocate(x, 8)
    assert x.block_ids == order[:2]


def test_eviction_forgets_hashes():
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    a = make_request("a", list(range(9)))
    compute(kv, a)
    assert len(kv.cached) == 2
    kv.free(a)
    b = make_request("b", list(range(50, 62)))     # takes all 3 blocks: evicts both cached ones
    assert kv.allocate(b, 12)
    assert kv.cached == {} and all(h is None for h in kv.block_hash)
    assert kv.find_cached_prefix(make_request("c", list(range(9)))) == []


def test_reviving_cached_free_blocks_counts_against_the_free_pool():
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    a = make_request("a", list(range(9)))
    compute(kv, a)
    kv.free(a)
    b = make_request("b", list(range(8)) + [7] * 8)   # 2 cached blocks + 8 tokens (2 blocks)
    cached = kv.find_cached_prefix(b)
    assert len(cached) == 2
    assert not kv.allocate(b, 8, cached)              # 2 revived + 2 new > 3
    assert b.block_ids == [] and kv.num_free_blocks == 3
    assert all(kv.ref_counts[x] == 0 for x in cached)
    assert kv.allocate(b, 4, cached)                  # 2 revived + 1 new
    assert kv.num_free_blocks == 0 and b.block_ids[:2] == cached


def test_image_content_hash_is_part_of_the_block_hash():
    def image(h):
        return MultiModalItem(h, offset=4, length=4, pixel_values=torch.zeros(1),
                              grid_thw=(1, 2, 2))
    tokens = list(range(4)) + [9] * 4 + list(range(20, 25))
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    a = make_request("a", tokens, [image("cat")])
    compute(kv, a)
    same = make_request("same", tokens, [image("cat")])
    other = make_request("other", tokens, [image("dog")])
    assert len(kv.find_cached_prefix(same)) == 3
    # the first block (text only) is shared; from the image block on, nothing is
    assert len(kv.find_cached_prefix(other)) == 1
    assert same.block_hashes[0] == other.block_hashes[0]
    assert same.block_hashes[1] != other.block_hashes[1]
    assert same.block_hashes[2] != other.block_hashes[2]   # chained: differs after the image too


def test_prefix_caching_off_never_registers_or_finds():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    compute(kv, make_request("a", list(range(9))))
    assert kv.cached == {}
    assert kv.find_cached_prefix(make_request("b", list(range(9)))) == []


def test_block_table_rows_follow_block_ids_and_grow():
    """The runner's block tables: a request's row holds its block ids, zero-padded, through
    allocations (cached prefix blocks included), the array's growth and frees."""
    kv = KVCacheManager(num_blocks=1000, block_size=BS)

    def row(req):
        table = kv.block_table
        return table.array[req.block_row, :table.lengths[req.block_row]].tolist()

    a = make_request("a", list(range(9)))
    compute(kv, a)
    b = make_request("b", list(range(8)) + [50])
    cached = kv.find_cached_prefix(b)
    assert kv.allocate(b, 1, cached)
    assert row(a) == a.block_ids and row(b) == b.block_ids and b.block_ids[:2] == cached
    # more requests than rows and more blocks than columns: the array grows
    many = [make_request(f"m{i}", [1000 + i] * 40) for i in range(80)]
    for r in many:
        assert kv.allocate(r, 20)
        r.num_computed_tokens = 20
        assert kv.allocate(r, 20)                  # 10 blocks, in two allocations
    for r in many[::7]:
        r.num_computed_tokens = 40
        assert kv.allocate(r, 30)                  # 18 blocks
    assert all(row(r) == r.block_ids for r in [a, b] + many)
    assert len({r.block_row for r in [a, b] + many}) == 82
    rows = [a.block_row, many[7].block_row]
    tables = kv.block_table.tables(rows)
    assert tables.shape == (2, 18) and tables[0].tolist() == a.block_ids + [0] * 15
    # a freed row is zeroed and handed out again
    freed = a.block_row
    kv.free(a)
    assert a.block_row == -1 and not kv.block_table.array[freed].any()
    c = make_request("c", list(range(300, 305)))
    assert kv.allocate(c, 5) and c.block_row == freed and row(c) == c.block_ids

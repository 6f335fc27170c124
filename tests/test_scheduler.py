"""Scheduler decisions, driven by hand: budgets, order, preemption, aborts."""
from autoglm_serve.engine.core.kv_cache import KVCacheManager
from autoglm_serve.engine.core.request import Request, RequestStatus
from autoglm_serve.engine.core.scheduler import Scheduler
from autoglm_serve.sampling_params import SamplingParams

BS = 4


def make_request(rid: str, prompt_len: int, first_token: int = 0) -> Request:
    return Request(rid, list(range(first_token, first_token + prompt_len)), SamplingParams(),
                   frozenset(), max_tokens=64)


def make_scheduler(num_blocks=64, budget=16, max_num_seqs=8, chunked=True) -> Scheduler:
    kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=False)
    return Scheduler(kv, max_num_seqs, budget, chunked)


def step(s: Scheduler, sampled_token: int = 7) -> dict[str, int]:
    """One schedule + 'model run': requests that reach their last token get one new token."""
    out = s.schedule(s.step_budget())
    s.update_after_launch(out.scheduled)
    for sr in out.scheduled:
        if sr.request.num_inflight:
            sr.request.land_token(sampled_token)
    return {sr.request.request_id: sr.num_new_tokens for sr in out.scheduled}


def test_decodes_first_then_prefill_chunks_under_the_budget():
    s = make_scheduler(budget=16)
    short, long = make_request("short", 5), make_request("long", 30, 100)
    s.add(short)
    s.add(long)
    assert step(s) == {"short": 5, "long": 11}             # long prompt chunked
    s.add(make_request("late", 4, 200))
    out = s.schedule()
    # the decode comes first in the batch, then the prefill chunk fills the rest
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == \
        [("short", 1), ("long", 15)]
    assert out.num_batched_tokens == 16
    assert not out.scheduled[1].samples                     # mid-prompt chunk: no token
    s.update_after_launch(out.scheduled)
    short.land_token(7)
    assert step(s) == {"short": 1, "long": 4, "late": 4}    # long's last 4, then the newcomer
    assert long.num_output_tokens == 1 and not s.waiting


def test_decoding_requests_shrink_the_step_budget_to_decode_step_tokens():
    kv = KVCacheManager(64, BS, enable_prefix_caching=False)
    s = Scheduler(kv, 8, 16, decode_step_tokens=6)
    s.add(make_request("first", 5))
    assert s.step_budget() == 16                            # nothing decodes yet
    assert step(s) == {"first": 5}
    s.add(make_request("long", 30, 100))
    assert s.step_budget() == 6                             # "first" decodes now
    assert step(s) == {"first": 1, "long": 5}
    s.finish(s.running[0], RequestStatus.FINISHED_STOPPED)
    assert s.step_budget() == 16                            # "long" is mid-prompt again
    assert Scheduler(kv, 8, 16, decode_step_tokens=32).step_budget() == 16


def test_max_num_seqs_is_respected():
    s = make_scheduler(budget=64, max_num_seqs=2)
    reqs = [make_request(f"r{i}", 3, 10 * i) for i in range(3)]
    for r in reqs:
        s.add(r)
    assert set(step(s)) == {"r0", "r1"}
    assert set(step(s)) == {"r0", "r1"}
    s.finish(reqs[0], RequestStatus.FINISHED_STOPPED)
    assert set(step(s)) == {"r1", "r2"}


def test_without_chunked_prefill_only_whole_prompts_are_scheduled():
    s = make_scheduler(budget=16, chunked=False)
    s.add(make_request("a", 10))
    s.add(make_request("b", 10, 50))
    assert step(s) == {"a": 10}                             # b does not fit whole: waits
    assert step(s) == {"a": 1, "b": 10}
    chunked = make_scheduler(budget=16, chunked=True)
    chunked.add(make_request("a", 10))
    chunked.add(make_request("b", 10, 50))
    assert step(chunked) == {"a": 10, "b": 6}


def test_preemption_picks_latest_arrival_and_requeues_it_first():
    s = make_scheduler(num_blocks=4, budget=64)
    first, second, third = make_request("first", 7), make_request("second", 7, 20), \
        make_request("third", 3, 40)
    s.add(first)
    s.add(second)
    assert step(s) == {"first": 7, "second": 7}             # 2 blocks each: cache full
    s.add(third)
    assert step(s) == {"first": 1, "second": 1}             # token 8 fits in block 2
    out = s.schedule()                                      # token 9 needs a 3rd block each
    assert out.preempted == [second]
    assert [x.request.request_id for x in out.scheduled] == ["first"]
    assert second.status == RequestStatus.WAITING and second.num_computed_tokens == 0
    assert second.block_ids == [] and second.num_preemptions == 1 and s.num_preemptions == 1
    assert list(s.waiting) == [second, third]               # ahead of the later arrival
    assert second.output_token_ids == [7, 7]                # its tokens are kept, recomputed
    assert len(first.block_ids) == 3 and s.kv.num_free_blocks == 1


def test_abort_frees_blocks_of_waiting_and_running_requests():
    s = make_scheduler(num_blocks=16, budget=8)
    running, prefilling, waiting = make_request("run", 6), make_request("pre", 20, 30), \
        make_request("wait", 5, 60)
    s.add(running)
    s.add(prefilling)
    step(s)                                                 # run: 6, pre: first 2 tokens
    s.add(waiting)
    step(s)                                                 # run decodes, pre gets 7 more
    assert prefilling.status == RequestStatus.RUNNING
    assert 0 < prefilling.num_computed_tokens < prefilling.num_prompt_tokens
    assert waiting.status == RequestStatus.WAITING
    for r in (waiting, prefilling, running):
        s.finish(r, RequestStatus.FINISHED_ABORTED)
        assert r.status == RequestStatus.FINISHED_ABORTED and r.block_ids == []
    assert s.kv.num_free_blocks == s.kv.num_blocks
    assert not s.has_unfinished() and s.schedule().is_empty
    s.finish(running, RequestStatus.FINISHED_ABORTED)      # twice is harmless
    assert s.kv.num_free_blocks == s.kv.num_blocks


def _with_image(rid: str, prompt_len: int, offset: int, length: int) -> Request:
    import torch

    from autoglm_serve.multimodal.inputs import MultiModalItem
    req = make_request(rid, prompt_len)
    req.mm_items = [MultiModalItem(f"image-{rid}", offset, length, torch.zeros(1, 1), (1, 2, 2))]
    return req


def test_a_few_tokens_before_an_unencoded_image_wait_for_it():
    """A chunk that an image still to encode would cut short runs only when what is left
    before the image is worth a forward of its own (MIN_CHUNK_BEFORE_IMAGE); a smaller one
    waits and joins the chunk that reads the image. Running and waiting prompts alike."""
    from autoglm_serve.engine.core.scheduler import MIN_CHUNK_BEFORE_IMAGE as MIN
    ready: set[str] = set()
    kv = KVCacheManager(512, BS, enable_prefix_caching=False)
    s = Scheduler(kv, 8, 4096, image_ready=lambda item: item.content_hash in ready)
    short = _with_image("short", 21 + 400 + 30, 21, 400)        # an agent's new turn
    long = _with_image("long", MIN + 400 + 30, MIN, 400)        # a whole history before it
    s.add(short)
    s.add(long)
    assert step(s) == {"long": MIN}          # short is held; long runs up to its image
    assert s.image_to_encode()[0] is short and short.status == RequestStatus.WAITING
    ready.add("image-short")
    assert step(s) == {"short": 451}         # the 21 tokens with the image; long still waits
    assert s.image_to_encode()[0] is long
    ready.add("image-long")
    assert step(s) == {"short": 1, "long": 430}

    # a running prompt whose chunks reached a few tokens short of its image
    chunked = _with_image("chunked", 600 + 400, 600, 400)
    s2 = Scheduler(KVCacheManager(512, BS, enable_prefix_caching=False), 8, 512,
                   image_ready=lambda item: item.content_hash in ready)
    s2.add(chunked)
    assert step(s2) == {"chunked": 512}       # the budget cuts it, not the image
    assert step(s2) == {} and s2.tokens_owed_by_running() == 0   # 88 left: they wait
    assert s2.image_to_encode()[0] is chunked
    ready.add("image-chunked")
    assert step(s2) == {"chunked": 488}


def test_the_encoder_serves_held_prompts_in_arrival_order():
    """A turn held whole by its image is encoded before the images of turns that arrived
    after it, also those admitted up to their image meanwhile (a long text before it): else a
    stream of such turns starves it. The image whose blocks are part run is kept."""
    from autoglm_serve.engine.core.scheduler import MIN_CHUNK_BEFORE_IMAGE as MIN
    ready: set[str] = set()
    s = Scheduler(KVCacheManager(2048, BS, enable_prefix_caching=False), 16, 4096,
                  image_ready=lambda item: item.content_hash in ready)
    held = _with_image("held", 20 + 400 + 30, 20, 400)
    held.arrival_time = 1.0
    later = []
    for i in range(3):
        r = _with_image(f"later{i}", MIN + 400 + 30, MIN, 400)
        r.arrival_time = 2.0 + i
        later.append(r)
    s.add(held)
    for r in later:
        s.add(r)
    assert step(s) == {r.request_id: MIN for r in later}    # admitted up to their images
    assert held.status == RequestStatus.WAITING
    assert s.image_to_encode()[0] is held
    # an image whose blocks are under way stays the encoder's until it is done
    assert s.image_to_encode(in_progress="image-later1")[0] is later[1]
    assert s.image_to_encode(in_progress="image-gone")[0] is held
    ready.add("image-held")
    assert s.image_to_encode()[0] is later[0]
    assert step(s) == {"held": 450}
    for r in later:
        assert s.image_to_encode()[0] is r
        ready.add(f"image-{r.request_id}")

"""Tensor parallelism on CPUs over gloo: TP=2 and TP=4 give TP=1's greedy tokens and its logits
(to fp32 rounding) on a tiny random GLM-4.1V with images in the prompts, the embedded SmolLM2
likewise at TP=3 (its 9 heads and 3 KV heads split over 3 ranks, not 2 or 4).

The tiny GLM-4.1V has 4 heads and 2 KV heads: TP=2 splits the KV heads one per rank, TP=4
replicates each on two. Its prompts put two images in one step (data-parallel vision tower:
image 0 encoded by rank 0, image 1 by rank 1, sent to the others) and one image across several
chunks (its later chunks take rank 0's encoder-cache rows, broadcast to the workers).
"""
import pytest
import torch

from autoglm_serve import LLM, SamplingParams
from autoglm_serve.engine.parallel.distributed import TensorParallelFailure
from tests.glm4v_fixtures import make_tiny_glm4v, tiny_tokenizer
from tests.test_glm4v_oracle import build_prompt, random_image

STEPS = 6


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_glm4v(tmp_path_factory.mktemp("glm4v-tp"))


def glm4v_prompts():
    tok = tiny_tokenizer()
    parts = [[random_image(56, 56, 1), "hi"], [random_image(56, 84, 2), "ok"],
             [random_image(224, 224, 3), "a longer one"], ["text only"]]
    return [{"prompt_token_ids": build_prompt(tok, p),
             "multi_modal_data": {"image": [x for x in p if not isinstance(x, str)]}}
            for p in parts]


def run(prompts, **settings):
    """Greedy tokens per prompt and every step's logits, then the engine stopped."""
    llm = LLM(dtype="float32", skip_tokenizer_init=True, **settings)
    run.last_model = llm.engine.core.loaded.model     # rank 0's shard
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.core.runner.logits_hook = lambda reqs, logits: [
        seen.setdefault(r.request_id, []).append(logits[i].clone()) for i, r in enumerate(reqs)]
    try:
        out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=STEPS,
                                                   ignore_eos=True))
    finally:
        llm.shutdown()
    # per request, in prompt order: the steps' batching may differ (weights mode encodes
    # images inside the step, the others ahead of it)
    return [o.outputs[0].token_ids for o in out], [seen[o.request_id] for o in out]


def assert_same(reference, got):
    (ref_tokens, ref_logits), (tokens, logits) = reference, got
    assert tokens == ref_tokens
    assert [len(x) for x in logits] == [len(x) for x in ref_logits]
    for prompt, (ours, ref) in enumerate(zip(logits, ref_logits)):
        for step, (a, b) in enumerate(zip(ours, ref)):
            assert a.shape == b.shape
            rel = ((a - b).norm() / b.norm()).item()
            assert rel < 1e-4, f"prompt {prompt} step {step}: relative error {rel:.2e}"


@pytest.fixture(scope="module")
def glm4v_reference(checkpoint):
    return run(glm4v_prompts(), model=str(checkpoint), max_model_len=512,
               max_num_batched_tokens=32, num_kv_blocks=256)


@pytest.mark.parametrize("tp,vision", [(2, "data"), (4, "data"), (2, "weights")])
def test_glm4v_with_images_equals_one_rank(checkpoint, glm4v_reference, tp, vision):
    got = run(glm4v_prompts(), model=str(checkpoint), max_model_len=512,
              max_num_batched_tokens=32, num_kv_blocks=256, tensor_parallel_size=tp,
              mm_encoder_tp_mode=vision)
    assert_same(glm4v_reference, got)
    model = run.last_model
    assert model.language_model.model.layers[0].self_attn.attn.num_kv_heads == max(1, 2 // tp)
    assert model.visual.blocks[0].attn.num_heads == (2 // tp if vision == "weights" else 2)
    # the two small images were encoded in one step: both ranks' shares of the tower ran
    assert glm4v_reference[0][0] != glm4v_reference[0][1]


def test_smollm2_equals_one_rank():
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
    reference = run(prompts, max_model_len=256, num_kv_blocks=64)
    assert_same(reference, run(prompts, max_model_len=256, num_kv_blocks=64,
                               tensor_parallel_size=3))


def test_a_model_that_does_not_split_is_refused_before_start():
    with pytest.raises(ValueError, match="does not divide its 9 attention heads"):
        LLM(tensor_parallel_size=2, skip_tokenizer_init=True)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_nccl_with_cuda_graphs_equal_one(checkpoint):
    """NCCL, the all-reduces captured in the decode graphs (bf16: tokens may part after a
    near tie, so the first few only)."""
    prompts = glm4v_prompts()
    settings = dict(model=str(checkpoint), max_model_len=512, device="cuda", dtype="bfloat16",
                    max_num_batched_tokens=32, num_kv_blocks=256)
    one = LLM(skip_tokenizer_init=True, **settings)
    two = LLM(skip_tokenizer_init=True, tensor_parallel_size=2, **settings)
    try:
        assert two.engine.core.runner.graphs is not None
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        a = [o.outputs[0].token_ids[:2] for o in one.generate(prompts, params)]
        b = [o.outputs[0].token_ids[:2] for o in two.generate(prompts, params)]
        assert a == b
    finally:
        two.shutdown()


def test_a_worker_dead_while_idle_fails_the_next_call_with_its_name(checkpoint):
    llm = LLM(str(checkpoint), dtype="float32", skip_tokenizer_init=True, max_model_len=512,
              num_kv_blocks=64, tensor_parallel_size=2)
    try:
        worker = llm.engine.core.workers.processes[0]
        worker.kill()       # reaped by the engine's watchdog
        with pytest.raises(TensorParallelFailure, match=r"worker rank 1 \(pid \d+\) was killed "
                                                        "by SIGKILL"):
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    finally:
        llm.shutdown()
    # the process can start another tensor-parallel engine afterwards
    assert not torch.distributed.is_initialized()

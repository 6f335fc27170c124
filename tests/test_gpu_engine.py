"""The GPU fast path (Triton attention, fused kernels, decode CUDA graphs) against plain PyTorch
(the reference attention backend, fused kernels off, eager), same weights, a mixed batch. Runs
only where CUDA is present."""
import os
import subprocess
import sys

import pytest
import torch

from autoglm_serve import LLM, SamplingParams
from tests.tiny_models import build_tiny_decoder

pytestmark = pytest.mark.gpu

PROMPTS = [[3 + i % 200 for i in range(n)] for n in (1, 7, 40, 130, 300)] + [[9, 8, 7] * 50]
STEPS = 16


# AutoGLM-Phone-9B's attention and hidden sizes (2 layers, a narrow MLP and vocabulary): the fused
# kernels at the shapes they run at in production.
REAL_SHAPES = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=2,
                   head_dim=128, intermediate_size=1024)


def build(tmp_path, arch):
    sizes = REAL_SHAPES if arch.endswith("-real-shapes") else {}
    path, _ = build_tiny_decoder(tmp_path / arch, arch.removesuffix("-real-shapes"),
                                 vocab_size=256, **sizes)
    return path


SAMPLING = {"greedy": {}, "open-autoglm": dict(top_p=0.85, frequency_penalty=0.2)}


def run(path, dtype, backend, eager, store, sampling="greedy", quantization=None,
        on_start=lambda: None, logprobs=None, block_size=16, cudagraph_mode="full_decode_only"):
    """The reference (torch backend) runs in plain PyTorch: the fused kernels off. on_start:
    called once the engine is up (its self-checks and graph captures done). Returns the
    engine and each prompt's (request id, completion)."""
    from autoglm_serve.kernels import fused_ops
    was = fused_ops.ENABLED
    fused_ops.ENABLED = was and backend != "torch"
    try:
        llm = LLM(str(path), skip_tokenizer_init=True, dtype=dtype, attention_backend=backend,
                  enforce_eager=eager, block_size=block_size, max_num_batched_tokens=128,
                  kv_cache_memory_gib=1, max_num_seqs=32, quantization=quantization,
                  cudagraph_mode=cudagraph_mode)
        llm.engine.core.runner.logits_hook = lambda reqs, logits: [
            store.setdefault(r.request_id, []).append(logits[i].float().cpu())
            for i, r in enumerate(reqs)]
        on_start()
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=STEPS,
                                                    ignore_eos=True, logprobs=logprobs,
                                                    **SAMPLING[sampling]))
    finally:
        fused_ops.ENABLED = was
    return llm, [(o.request_id, o.outputs[0]) for o in outs]


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


ARCHS = ["llama", "glm4", "glm4-real-shapes"]


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("arch", ARCHS)
def test_fast_path_matches_reference_fp32(tmp_path, arch, sampling):
    """In float32 every kernel is exact up to summation order: tokens identical at every step,
    also with Open-AutoGLM's penalty (device-side counts on the async path, against the
    reference's eager steps), prompt steps through their piecewise graphs."""
    path = build(tmp_path, arch)
    ref_logits, fast_logits = {}, {}
    _, ref = run(path, "float32", "torch", True, ref_logits, sampling)
    llm, fast = run(path, "float32", "triton", False, fast_logits, sampling,
                    cudagraph_mode="full_and_piecewise")
    runner = llm.engine.core.runner
    # decode steps replayed whole, steps with prompt chunks (up to 128 tokens, decodes beside
    # them) piece by piece between their attentions
    assert runner.graphs is not None and runner.prompt_graphs.replays > 0
    for (rid_a, a), (rid_b, b) in zip(ref, fast):
        assert a.token_ids == b.token_ids
        for x, y in zip(ref_logits[rid_a], fast_logits[rid_b]):
            assert rel(y, x) < 1e-3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_path_on_pages_of_64_matches_reference(tmp_path, dtype):
    """Pages of 64 tokens, whose K/V the prefill attention loads as TMA boxes on a Hopper GPU
    (the prompts come in chunks of up to 128 tokens, so later chunks read cached pages):
    float32 tokens identical to the reference's, bf16's first tokens."""
    path = build(tmp_path, "glm4-real-shapes")
    ref_logits, fast_logits = {}, {}
    _, ref = run(path, dtype, "torch", True, ref_logits, block_size=64)
    _, fast = run(path, dtype, "triton", False, fast_logits, block_size=64)
    for (rid_a, a), (rid_b, b) in zip(ref, fast):
        if dtype == "float32":
            assert a.token_ids == b.token_ids
        assert a.token_ids[0] == b.token_ids[0]
        assert rel(fast_logits[rid_b][0], ref_logits[rid_a][0]) < (1e-3 if dtype == "float32"
                                                                    else 3e-2)


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_path_matches_reference_bf16(tmp_path, arch):
    """In bf16 rounding differs between paths: logits within bf16 tolerance while the tokens
    agree, and the first tokens identical."""
    path = build(tmp_path, arch)
    ref_logits, fast_logits = {}, {}
    _, ref = run(path, "bfloat16", "torch", True, ref_logits)
    _, fast = run(path, "bfloat16", "triton", False, fast_logits)
    for (rid_a, a), (rid_b, b) in zip(ref, fast):
        a, b = a.token_ids, b.token_ids
        assert a[0] == b[0]
        agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        for x, y in zip(ref_logits[rid_a][:agree + 1], fast_logits[rid_b][:agree + 1]):
            assert rel(y, x) < 3e-2


def test_logprobs_come_back_from_the_fast_path(tmp_path):
    """Logprobs on the CUDA fast path (async steps copy them to pinned host memory) equal the
    reference's in float32, with Open-AutoGLM's sampling: the sampled token's, its rank and
    the top 3, at every step, from the decode graphs too."""
    path = build(tmp_path, "glm4")
    _, ref = run(path, "float32", "torch", True, {}, "open-autoglm", logprobs=3)
    llm, fast = run(path, "float32", "triton", False, {}, "open-autoglm", logprobs=3)
    assert llm.engine.core.runner.graphs is not None
    for (_, a), (_, b) in zip(ref, fast):
        assert a.token_ids == b.token_ids
        assert len(a.logprobs) == len(b.logprobs) == STEPS
        for token, x, y in zip(a.token_ids, a.logprobs, b.logprobs):
            assert x.keys() == y.keys() and token in y
            for tid in x:
                assert x[tid].rank == y[tid].rank
                assert abs(x[tid].logprob - y[tid].logprob) < 1e-3


@pytest.mark.parametrize("arch,eager", [("glm4", True), ("glm4-real-shapes", False)])
def test_fp8_layers_take_the_norms_quantized_rows_bitwise(tmp_path, arch, eager, monkeypatch):
    """--quantization fp8: the fused norm pair writes qkv's and gate_up's input quantized per
    token (and each row's amax, which the one-row FP8 GEMV takes), replacing the layers' own
    quantization. The same codes and scales, so the same logits bit for bit and the same tokens
    as with the layers quantizing for themselves, eager and in the decode CUDA graphs. (Eager,
    the calls are counted from the start of generation: the start-up self-check makes both
    kinds, and graph replays make no Python calls.)"""
    from autoglm_serve.quantization import fp8
    given = []
    linear = fp8.fp8_linear

    def watch(x, weight, weight_scale, bias, fp8_rows=None):
        given.append(fp8_rows is not None)
        return linear(x, weight, weight_scale, bias, fp8_rows)
    monkeypatch.setattr(fp8, "fp8_linear", watch)
    path = build(tmp_path, arch)
    with_rows, own_pass = {}, {}
    _, a = run(path, "bfloat16", "triton", eager, with_rows, quantization="fp8",
               on_start=given.clear)
    assert any(given) or not eager, "no FP8 layer was given the norm's quantized rows"
    monkeypatch.setattr(fp8.Fp8LinearMethod, "takes_fp8_rows", False)
    _, b = run(path, "bfloat16", "triton", eager, own_pass, quantization="fp8",
               on_start=given.clear)
    assert not any(given) and (given or not eager)
    for (rid_a, ta), (rid_b, tb) in zip(a, b):
        assert ta.token_ids == tb.token_ids
        for x, y in zip(with_rows[rid_a], own_pass[rid_b]):
            assert torch.equal(x, y)


def test_mixed_steps_compile_nothing_once_serving(tmp_path, caplog):
    """Start-up compiles the decode kernel that mixed steps run (decodes beside a prompt chunk,
    their K/V written by the write kernel) for every decode split, as well as the decode
    graphs' own variant: 40 prompts admitted a chunk at a time give mixed steps of 1 to 39
    decodes (decode splits of 64, 32, 16 and 8 partitions), and no Triton kernel compiles."""
    import logging
    path = build(tmp_path, "glm4-real-shapes")
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="bfloat16", block_size=16,
              max_num_batched_tokens=96, kv_cache_memory_gib=1, max_num_seqs=64)
    prompts = [[3 + (i * 7 + j) % 200 for j in range(20 + i % 9)] for i in range(40)]
    with caplog.at_level(logging.WARNING, logger="autoglm_serve.kernels.compile_watch"):
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24,
                                                    ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
    compiles = [r.getMessage() for r in caplog.records if "compiled while serving" in
                r.getMessage()]
    assert not compiles, compiles


COLD_START = """
import logging, sys
logging.basicConfig(level=logging.WARNING)
from autoglm_serve import LLM, SamplingParams
llm = LLM(sys.argv[1], skip_tokenizer_init=True, dtype="bfloat16", block_size=16,
          max_num_batched_tokens=96, kv_cache_memory_gib=1, max_num_seqs=8)
assert llm.engine.core.runner.graphs is not None, "no decode graphs"
outs = llm.generate([[3, 4, 5] * 5, [7] * 40], SamplingParams(temperature=0.8, max_tokens=8,
                                                              ignore_eos=True))
assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8]
"""


def test_decode_graphs_capture_on_a_cold_triton_cache(tmp_path):
    """A new process with an empty Triton cache (a new machine or Triton version) starts the
    engine, captures its decode graphs with no kernel compiled inside a capture, and samples.
    The decode kernel's graph variant used to compile inside the capture: with a cold cache
    that invalidated it, the engine failed to start, and the failed capture left the process's
    CUDA generator unusable (5 of 7 of this file's tests failed on fresh H100s)."""
    path = build(tmp_path, "glm4-real-shapes")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    proc = subprocess.run([sys.executable, "-c", COLD_START, str(path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "compiled while capturing" not in proc.stderr, proc.stderr[-6000:]
    assert os.listdir(tmp_path / "triton-cache")   # the cache was used, and was cold


def test_decode_graphs_keep_one_batch_of_logits_and_the_memory_plan_counts_them(tmp_path):
    """The decode graphs (batches 1..256) write their logits into one buffer of the largest
    batch's rows. Each graph's own logits stayed allocated in the graphs' shared pool: at GLM's
    151,552-token vocabulary, 2,191 rows over the 24 batch sizes, 664 MB in bf16. What the
    graphs keep is in the start-up memory plan (it was not: the KV cache could take it)."""
    from autoglm_serve.engine.core.worst_step import profile_worst_step
    vocab, max_num_seqs = 151_552, 256
    path, _ = build_tiny_decoder(tmp_path / "glm4", "glm4", vocab_size=vocab)
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="bfloat16", block_size=16,
              max_num_batched_tokens=128, kv_cache_memory_gib=1, max_num_seqs=max_num_seqs)
    runner = llm.engine.core.runner
    assert runner.graphs is not None and runner.graphs.max_size == max_num_seqs
    planned = profile_worst_step(runner, decode_graphs=True)["decode graphs"]
    runner.graphs = None     # captured again below, measured
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    runner.capture_cuda_graphs()
    held = torch.cuda.memory_allocated() - before
    one_batch = max_num_seqs * vocab * 2
    assert held < 2 * one_batch, (held, one_batch)
    assert 0.95 * held <= planned <= 1.5 * held, (planned, held)
    # and the engine decodes on the graphs captured again (40 rows: the 48-row graph)
    outs = llm.generate([[3 + i, 4, 5] for i in range(40)],
                        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)


def test_a_kernel_that_fails_its_check_is_replaced_before_the_memory_plan(tmp_path,
                                                                           monkeypatch):
    """The start-up memory plan measures the worst step on what will serve: an attention
    backend that fails its self-check is replaced by PyTorch's before the plan runs (PyTorch's
    attention peaks higher; measured on the Triton kernels, the KV cache could take that
    memory), and the engine then serves on it."""
    from autoglm_serve.engine.core import memory_plan
    from autoglm_serve.models.layers.triton_attention import TritonAttentionBackend
    monkeypatch.setattr(TritonAttentionBackend, "self_check", lambda self, *a, **kw: False)
    measured_on = []
    profile = memory_plan.profile_worst_step

    def recording(runner, *args, **kwargs):
        measured_on.append(runner.backend.name)
        return profile(runner, *args, **kwargs)
    monkeypatch.setattr(memory_plan, "profile_worst_step", recording)
    llm = LLM(str(build(tmp_path, "glm4")), skip_tokenizer_init=True, dtype="bfloat16",
              block_size=16, max_num_batched_tokens=128, max_num_seqs=8,
              gpu_memory_utilization=0.3)
    assert measured_on == ["torch"]
    assert llm.engine.core.runner.backend.name == "torch"
    out = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


def _png_url(k: int, width: int, height: int) -> str:
    import base64
    import io

    from PIL import Image
    image = Image.new("RGB", (width, height), (40 * k % 256, 90, 160))
    image.paste((255, 255 - 60 * k % 256, 0), (k * 7, k * 5, k * 7 + 30, k * 5 + 20))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_image_steps_through_prompt_graphs_match_eager_prompts(tmp_path):
    """GLM-4.1V with screenshots: prompt steps through the piecewise graphs (the image features
    merged into the static input embeddings, M-RoPE positions) give the same greedy tokens in
    float32 as prompt steps run eagerly (cudagraph_mode full_decode_only)."""
    from tests.glm4v_fixtures import make_tiny_glm4v
    path = make_tiny_glm4v(tmp_path / "glm4v")
    conversations = [[{"role": "user", "content": [
        {"type": "text", "text": f"step {k}: " + "tap the button. " * (3 * k + 1)},
        {"type": "image_url", "image_url": {"url": _png_url(k, 112 + 28 * k, 140)}},
        {"type": "text", "text": "what next?"}]}] for k in range(4)]
    tokens = {}
    for mode in ("full_and_piecewise", "full_decode_only"):
        llm = LLM(str(path), dtype="float32", block_size=16, max_model_len=512,
                  max_num_batched_tokens=64, kv_cache_memory_gib=1, cudagraph_mode=mode)
        outs = llm.chat(conversations, SamplingParams(temperature=0, max_tokens=12,
                                                      ignore_eos=True))
        tokens[mode] = [o.outputs[0].token_ids for o in outs]
        graphs = llm.engine.core.runner.prompt_graphs
        assert (graphs is not None and graphs.replays > 0) == (mode == "full_and_piecewise")
        del llm
    assert tokens["full_and_piecewise"] == tokens["full_decode_only"]


def test_prompt_graphs_memory_is_in_the_memory_plan(tmp_path):
    """What the prompt steps' graphs hold once captured (static buffers, and their pool's
    reserved memory) is what the start-up memory plan counts for them, within rounding."""
    from autoglm_serve.engine.core.worst_step import profile_worst_step
    path = build(tmp_path, "glm4-real-shapes")
    llm = LLM(str(path), skip_tokenizer_init=True, dtype="bfloat16", block_size=16,
              max_num_batched_tokens=2048, kv_cache_memory_gib=1, max_num_seqs=32,
              cudagraph_mode="full_and_piecewise")
    runner = llm.engine.core.runner
    assert runner.prompt_graphs.max_size == 1024    # larger prompt steps run eagerly
    planned = profile_worst_step(runner, prompt_graphs=True)["prompt graphs"]
    runner.prompt_graphs = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    runner.prompt_graphs = runner.new_prompt_graphs()
    runner.prompt_graphs.capture()
    torch.cuda.empty_cache()    # the warm-ups' blocks; the graphs' pool stays reserved
    held = torch.cuda.memory_reserved() - before
    assert 0.8 * held <= planned <= 1.5 * held, (planned, held)
    outs = llm.generate([[3 + i, 4, 5] * 30 for i in range(6)],     # 540 tokens: one step
                        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)
    assert runner.prompt_graphs.replays > 0

"""Runs a scheduled step: its host inputs (engine/core/input_batch.py) staged on the device,
the model (a captured CUDA graph for a pure-decode step, eager otherwise, image features from
engine/core/image_embedding.py), the sampler, and the sampled tokens on their way back without
a wait; also the KV cache's allocation and binding, and the start-up backend check.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
from torch import nn

from autoglm_serve.engine.core.fault_injection import FaultInjector
from autoglm_serve.engine.core.image_embedding import ImageStep, embed_step_images, plan_images
from autoglm_serve.engine.core.image_encoder import ImageEncoder
from autoglm_serve.engine.core.input_batch import HostBatch, build_host_batch
from autoglm_serve.engine.core.kv_cache import BlockTable
from autoglm_serve.engine.core.prompt_logprobs import PromptLogprobChunk, prompt_logprob_chunks
from autoglm_serve.engine.core.request import Request
from autoglm_serve.engine.core.sampler import (Sampler, SamplerOutput, SamplingRow,
                                               greedy_tokens)
from autoglm_serve.engine.core.scheduler import ScheduledRequest
from autoglm_serve.engine.core.token_counts import DeviceTokenCounts
from autoglm_serve.engine.parallel.layout import SINGLE
from autoglm_serve.host_transfer import to_device
from autoglm_serve.structured.bitmask import fill_step_bitmask
from autoglm_serve.models.layers.attention import (Attention, AttentionBackend, AttentionMetadata,
                                                  new_kv_cache)
from autoglm_serve.multimodal.encoder_cache import EncoderCache

logger = logging.getLogger(__name__)


@dataclass
class StepResult:
    requests: list[Request]          # those that sampled a token this step, in row order
    sampled: list[int]
    sampler_output: SamplerOutput | None


@dataclass
class InFlightStep:
    """A launched step: its sampled tokens are on their way to pinned host memory."""
    requests: list[Request]
    tokens_host: torch.Tensor | None
    done: torch.cuda.Event | None
    sampler_output: SamplerOutput | None   # its logprobs already on their way to the host
    needs_sync: bool = False         # prompt logprobs: the host reads this step's at once
    prompt_logprobs: list[PromptLogprobChunk] | None = None

    def result(self) -> StepResult:
        if self.done is not None:
            self.done.synchronize()
        sampled = self.tokens_host.tolist() if self.tokens_host is not None else []
        return StepResult(self.requests, sampled, self.sampler_output)


def _plain_greedy(req: Request) -> bool:
    return (req.argmax_only
            and len(req.output_token_ids) + req.num_inflight >= req.sampling_params.min_tokens)


def logprobs_to_host(out: SamplerOutput, pin: bool = True) -> SamplerOutput:
    """The logprob tensors copied to (pinned) host memory without waiting (read once the
    step's event has fired): a blocking copy would wait for the step queued after this one."""
    lp = out.logprobs
    if lp is None:
        return out
    host = {}
    for f in fields(lp):
        t = getattr(lp, f.name)
        host[f.name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
        host[f.name].copy_(t, non_blocking=True)
    return SamplerOutput(out.sampled_token_ids, replace(lp, **host))


class ModelRunner:
    def __init__(self, model: nn.Module, backend: AttentionBackend, device: torch.device,
                 dtype: torch.dtype, block_size: int, max_model_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int, vocab_size: int,
                 kv_dtype: torch.dtype | None = None):
        self.model = model
        self.kv_dtype = kv_dtype or dtype     # the KV cache's (fp8 with --kv-cache-dtype fp8)
        self.backend = backend
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_tokens = max_num_batched_tokens
        self.vocab_size = vocab_size
        self.max_blocks_per_seq = (max_model_len + block_size - 1) // block_size
        self.uses_mrope = bool(getattr(model, "uses_mrope", False))
        self.sampler = Sampler()
        self.token_counts = DeviceTokenCounts(vocab_size, device)
        self.kv_caches: list[torch.Tensor] = []
        self.attention_layers = [m for m in model.modules() if isinstance(m, Attention)]
        for layer in self.attention_layers:
            layer.backend = backend
        model.bound_runner = None       # whose KV cache and backend the layers hold
        # Observer of every step's logits (tests compare them with transformers).
        self.logits_hook: Callable[[list[Request], torch.Tensor], None] | None = None
        self.encoder_cache = EncoderCache() if hasattr(model, "embed_images") else None
        self.images = (ImageEncoder(model, self.encoder_cache, device)
                       if self.encoder_cache is not None else None)
        self.graphs = None      # DecodeGraphs once captured (CUDA, triton backend)
        self.prompt_graphs = None   # PromptGraphs once captured (also cudagraph_mode piecewise)
        self.block_table: BlockTable | None = None      # the KV manager's, set by the core
        self._prev_tokens: torch.Tensor | None = None   # the last launched step's samples
        self._prev_rows: dict[str, int] = {}
        self._prev_host: torch.Tensor | None = None     # ...on their way to the host
        self._prev_done: torch.cuda.Event | None = None
        self.faults = FaultInjector.from_env()      # None unless a test asks for faults
        # requests whose prompt logprobs are still to compute (the core keeps it)
        self.prompt_logprob_ids: set[str] = set()
        self._prompt_chunks: list[PromptLogprobChunk] = []
        # tensor parallelism (engine/parallel/): this rank's place, and on rank 0 the workers
        # that run each step with it
        self.layout = SINGLE
        self.workers = None

    # ---- KV cache -------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        per_layer = 0
        for layer in self.attention_layers:
            per_layer += 2 * layer.num_kv_heads * self.block_size * layer.head_dim
        return per_layer * torch.tensor([], dtype=self.kv_dtype).element_size()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = []
        for layer in self.attention_layers:
            self.kv_caches.append(new_kv_cache(num_blocks, layer.num_kv_heads, self.block_size,
                                               layer.head_dim, self.kv_dtype, self.device))
        self.model.bound_runner = None
        self.bind_kv_cache()

    def release_memory(self) -> None:
        """After running out of device memory: the encoder cache's embeddings (recomputed
        when needed) and the allocator's unused blocks go back to the device."""
        if self.encoder_cache is not None:
            self.encoder_cache.evict_all()
            self.images.reset()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- inputs ---------------------------------------------------------------------------
    def _to_device(self, data, dtype) -> torch.Tensor:
        return to_device(data, dtype, self.device)

    def prepare_host(self, scheduled: list[ScheduledRequest]) -> HostBatch:
        return build_host_batch(scheduled, self.block_table, self.block_size, self.uses_mrope,
                                self._prev_rows)

    def device_inputs(self, hb: HostBatch):
        meta = AttentionMetadata(
            num_seqs=hb.num_seqs, num_decodes=hb.num_decodes, num_tokens=len(hb.input_ids),
            max_query_len=hb.max_query_len, max_seq_len=int(hb.seq_lens.max()),
            query_start_loc=self._to_device(hb.query_start, torch.int32),
            seq_lens=self._to_device(hb.seq_lens, torch.int32),
            block_tables=self._to_device(hb.block_tables, torch.int32),
            slot_mapping=self._to_device(hb.slot_mapping, torch.int64),
            query_start_loc_cpu=hb.query_start, seq_lens_cpu=hb.seq_lens)
        ids = self._to_device(hb.input_ids, torch.int64)
        pos = self._to_device(hb.positions, torch.int64)
        logits_index = self._to_device(hb.logits_index, torch.int64)
        return ids, pos, meta, logits_index

    # ---- step -----------------------------------------------------------------------------
    def check_kernels(self) -> None:
        """Start-up checks of every Triton kernel this model may run against its PyTorch twin
        (the fused elementwise ops, the GEMVs, the quantized decode kernels, the attention
        backend); one that fails is switched off for PyTorch's. They run before the memory plan,
        which must measure what runs (a fallback's peak, not the kernel's), and before capture
        (they compile)."""
        from autoglm_serve.engine.core.kernel_checks import check_fused_ops
        from autoglm_serve.kernels import gemv
        from autoglm_serve.quantization.kernel_checks import check_decode_kernels
        check_fused_ops(self.device, self.dtype)
        gemv.self_check(self.device, self.dtype)
        check_decode_kernels(self.model, self.device, self.dtype)
        self.check_backend()

    def check_backend(self) -> None:
        """Start-up check of the attention backend at this model's shapes: one whose kernels
        fail or disagree with PyTorch is replaced by the PyTorch reference backend, so a kernel
        problem on a new GPU or Triton version costs speed, never correctness."""
        layer = self.attention_layers[0]
        if self.backend.self_check(self.device, self.dtype, layer.num_heads, layer.num_kv_heads,
                                   layer.head_dim):
            return
        from autoglm_serve.models.layers.torch_attention import TorchAttentionBackend
        logger.warning("attention backend %r failed its self-check: using the PyTorch backend",
                       self.backend.name)
        self.backend = TorchAttentionBackend()
        self.model.bound_runner = None
        self.bind_kv_cache()

    def wants_cuda_graphs(self, config) -> bool:
        return not config.enforce_eager and self.backend.name == "triton"

    def wants_prompt_graphs(self, config) -> bool:
        """Piecewise graphs for prompt steps too (config.cudagraph_mode); not under tensor
        parallelism, whose steps run on every rank."""
        return (self.wants_cuda_graphs(config) and config.cudagraph_mode == "full_and_piecewise"
                and config.tensor_parallel_size == 1)

    def new_prompt_graphs(self):
        from autoglm_serve.engine.core.prompt_graphs import PromptGraphs
        return PromptGraphs(self.model, self.attention_layers, self.device, self.dtype,
                            self.max_num_tokens, self.max_model_len, self.max_blocks_per_seq,
                            self.uses_mrope)

    def capture_cuda_graphs(self, prompt_graphs: bool = False) -> None:
        from autoglm_serve.engine.core.cuda_graphs import DecodeGraphs
        self.graphs = DecodeGraphs(self.model, self.backend, self.device, self.max_num_seqs,
                                   self.max_blocks_per_seq, self.uses_mrope)
        self.graphs.capture(self.max_model_len)
        if prompt_graphs:
            self.prompt_graphs = self.new_prompt_graphs()
            self.prompt_graphs.capture()
            graphs = self.prompt_graphs
            logger.info("captured piecewise CUDA graphs for prompt steps (%d sizes, %d..%d "
                        "tokens, %d pieces each) in %.1f s", len(graphs.sizes), graphs.sizes[0],
                        graphs.max_size, len(graphs.layers) + 1, graphs.capture_seconds)

    def _logits(self, hb: HostBatch, images: ImageStep | None) -> torch.Tensor | None:
        n = hb.num_seqs
        self._prompt_chunks = []
        if (self.graphs is not None and hb.num_decodes == n and n <= self.graphs.max_size
                and not hb.has_images and not self.prompt_logprob_ids):
            self.graphs.load(n, hb.input_ids, hb.positions, hb.slot_mapping, hb.seq_lens,
                             hb.block_tables)
            self._feed(self.graphs.input_ids, hb)
            return self.graphs.replay(n)
        ids, pos, meta, logits_index = self.device_inputs(hb)
        self._feed(ids, hb)
        inputs_embeds = embed_step_images(self.model, images, ids, self.encoder_cache,
                                          self.layout) if images is not None else None
        if self.prompt_graphs is not None and len(ids) <= self.prompt_graphs.max_size:
            if inputs_embeds is None:
                inputs_embeds = self.model.get_input_embeddings(ids)
            hidden = self.prompt_graphs.forward(inputs_embeds, pos, meta)
        else:
            hidden = self.model(ids, pos, meta, inputs_embeds=inputs_embeds)
        if self.prompt_logprob_ids:
            self._prompt_chunks = prompt_logprob_chunks(
                self.model, hidden, hb.batch, hb.query_start, self.prompt_logprob_ids)
        if not len(hb.logits_index):
            return None
        return self.model.compute_logits(hidden[logits_index])

    def bind_kv_cache(self) -> None:
        """Points the attention layers at this runner's cache: engines may share one model
        (tests, `LLM(loaded=...)`), so the runner that steps it last binds it, once."""
        if getattr(self.model, "bound_runner", None) is self:
            return
        for layer, cache in zip(self.attention_layers, self.kv_caches):
            layer.kv_cache = cache
            layer.backend = self.backend
        self.model.bound_runner = self

    def _feed(self, ids: torch.Tensor, hb: HostBatch) -> None:
        """Input ids sampled by the previous (in-flight) step, copied device to device."""
        if len(hb.feed_at):
            at = self._to_device(hb.feed_at, torch.int64)
            src = self._to_device(hb.feed_from, torch.int64)
            ids.index_copy_(0, at, self._prev_tokens.index_select(0, src))

    @torch.inference_mode()
    def launch(self, scheduled: list[ScheduledRequest]) -> InFlightStep:
        """Queues the step on the device and returns without waiting for it."""
        self.bind_kv_cache()
        if self.faults is not None:
            self.faults.check(scheduled)
        hb = self.prepare_host(scheduled)
        images = plan_images(self.encoder_cache, hb.batch) \
            if hb.has_images and self.encoder_cache is not None else None
        if self.workers is None:
            return self._run(hb, images)
        self.workers.send_step(hb, images)
        # the workers now run this step: a failure here leaves them mid-step, out of lockstep
        return self.workers.collective(lambda: self._run(hb, images))

    def _run(self, hb: HostBatch, images: ImageStep | None) -> InFlightStep:
        logits = self._logits(hb, images)
        chunks = self._prompt_chunks or None
        if logits is None:
            return InFlightStep([], None, None, None, chunks is not None, chunks)
        sampling = hb.sampling
        if self.logits_hook is not None:
            self.logits_hook(sampling, logits)
        # Structured rows: their bitmasks are filled here, while the device runs the forward
        # just queued (and, on the async path, the step before it ends)
        bitmask = fill_step_bitmask(sampling, logits.shape[-1], self._inflight_token,
                                    pin=self.device.type == "cuda")
        out = None
        if all(_plain_greedy(r) for r in sampling):
            # the common agent/benchmark case: no per-row tensors to build, one argmax
            tokens = greedy_tokens(logits)
        else:
            rows = [SamplingRow(r.sampling_params, r.prompt_token_ids, r.output_token_ids,
                                r.generator, r.eos_token_ids, r.num_inflight) for r in sampling]
            penalized = [r.penalized for r in sampling]
            slots = history = None
            if any(penalized):
                slots, counts, mask = self.token_counts.gather(
                    sampling, penalized, any(r.repetition_penalized for r in sampling))
                history = (counts, mask)
            out = self.sampler.sample(logits, rows, history, bitmask)
            tokens = out.sampled_token_ids
            if slots is not None:
                self.token_counts.record(slots, tokens)
        if self.workers is not None:
            self.workers.share_tokens(tokens)
        self._prev_tokens = tokens
        self._prev_rows = {r.request_id: i for i, r in enumerate(sampling)}
        cuda = self.device.type == "cuda"
        # logprobs take the same copy on every device (pinned on a GPU), so that CPU runs
        # test the path GPU runs take
        if out is not None:
            out = logprobs_to_host(out, pin=cuda)
        done = None
        if cuda:
            host = self._pinned_tokens(tokens.shape[0])
            host.copy_(tokens, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            host = tokens
        self._prev_host, self._prev_done = host, done
        return InFlightStep(sampling, host, done, out, chunks is not None, chunks)

    def _inflight_token(self, req: Request) -> int:
        """The token the step in flight sampled for req (waits for its copy to the host;
        the device meanwhile runs the forward queued after it)."""
        if self._prev_done is not None:
            self._prev_done.synchronize()
        return int(self._prev_host[self._prev_rows[req.request_id]])

    def _pinned_tokens(self, n: int) -> torch.Tensor:
        """A fresh pinned buffer per step: the previous step's may still be read."""
        return torch.empty(n, dtype=torch.int64, pin_memory=True)

"""Piecewise CUDA graphs for steps with prompt tokens: everything but attention, replayed.

A step that carries prompt chunks runs the model eagerly: ~400 launches from Python through 40
layers: 21.7 ms of CPU a launch on an H100 machine, offline and served alike (47-67 ms of launch
in served runs on another machine of that kind), as long as a step of a few hundred tokens
takes on the device, which then waits for the host (BENCHMARKS.md, 2026-12-07). As vLLM does
(--cudagraph-mode full_and_piecewise), the forward is captured at padded token counts as graphs
split at each attention: a piece runs from one layer's attention output to the next layer's q,
k and v (o_proj, norms, MLP, the next qkv projection), and the attention between two pieces,
whose launch depends on the step's sequences, runs eagerly on the step's own metadata. A
launch then took 10.0 ms of CPU instead of 21.7 (16 agents, steps of up to 1,024 tokens).

Every piece of every size reads and writes the same static buffers (the first rows of each),
outside the graphs' shared memory pool: the input embeddings and positions, each attention's
q, k, v and output, the rotary tables and the final hidden states. Nothing captured in the pool
outlives a forward, so one pool serves all sizes (captured largest first). A step of T tokens
replays the smallest size >= T; the padding rows compute on zeros and stale rows, each row on
its own, and no attention reads them (they are past the step's last sequence)."""
from __future__ import annotations

import itertools
import time

import torch

from autoglm_serve.engine.core.cuda_graphs import padded_size
from autoglm_serve.kernels import compile_watch
from autoglm_serve.models.layers.attention import Attention, AttentionMetadata

# Larger prompt steps run eagerly: their device time (AutoGLM on an H100: ~30 ms at 800
# tokens, ~60 ms at 2,048) hides the host's, and the pool holds the largest size's activations
# (0.44 GiB at 2,048 tokens).
MAX_TOKENS = 1024


def capture_sizes(max_tokens: int) -> list[int]:
    """Padded token counts: every 128 from 256, so at most 127 rows of padding, which cost the
    device their linears' time (with sizes 256 apart, one H100 run's 16-agent prompt steps took
    ~5% longer than eager ones: BENCHMARKS.md of 2026-12-07)."""
    cap = min(max_tokens, MAX_TOKENS)
    sizes = [16, 32, 64, 128] + list(range(256, MAX_TOKENS, 128))
    return [s for s in sizes if s < cap] + [cap]


def prefill_meta(num_tokens: int, max_model_len: int, max_blocks_per_seq: int,
                 device: torch.device) -> AttentionMetadata:
    """A prefill of num_tokens new tokens in sequences of at most max_model_len, writing no K/V
    and reading page 0: for runs whose outputs do not matter (memory profiles, warm-ups)."""
    meta_seq = min(num_tokens, max_model_len)
    num_seqs = (num_tokens + meta_seq - 1) // meta_seq
    lens = [meta_seq] * (num_seqs - 1) + [num_tokens - meta_seq * (num_seqs - 1)]
    qsl = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return AttentionMetadata(
        num_seqs=num_seqs, num_decodes=0, num_tokens=num_tokens, max_query_len=max(lens),
        max_seq_len=max(lens), query_start_loc=qsl.to(device), seq_lens=seq_lens.to(device),
        block_tables=torch.zeros(num_seqs, max_blocks_per_seq, dtype=torch.int32, device=device),
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens)


class PromptGraphs:
    def __init__(self, model, layers: list[Attention], device: torch.device, dtype: torch.dtype,
                 max_num_batched_tokens: int, max_model_len: int, max_blocks_per_seq: int,
                 uses_mrope: bool):
        self.model = model
        self.layers = layers
        self.device = device
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = max_blocks_per_seq
        self.sizes = capture_sizes(max_num_batched_tokens)
        n = self.sizes[-1]
        first = layers[0]
        hidden = model.get_input_embeddings(torch.zeros(1, dtype=torch.int64,
                                                        device=device)).shape[-1]
        half = first.rotary.rotary_dim // 2
        self.embeds = torch.zeros(n, hidden, dtype=dtype, device=device)
        self.positions = torch.zeros((3, n) if uses_mrope else (n,), dtype=torch.int64,
                                     device=device)
        self.q = torch.zeros(n, first.num_heads * first.head_dim, dtype=dtype, device=device)
        self.k = torch.zeros(n, first.num_kv_heads * first.head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.out = torch.zeros_like(self.q)
        self.cos = torch.zeros(n, half, dtype=torch.float32, device=device)
        self.sin = torch.zeros_like(self.cos)
        self.hidden = torch.zeros(n, hidden, dtype=dtype, device=device)
        self.pieces: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.replays = 0
        self.capture_seconds = 0.0

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    def eager(self, size: int) -> None:
        """A forward of the first ``size`` static rows as the graphs will run it, eagerly (the
        warm-up before a capture: every kernel compiles outside the graph)."""
        meta = prefill_meta(size, self.max_model_len, self.max_blocks_per_seq, self.device)
        self.model(None, self.positions[..., :size], meta, inputs_embeds=self.embeds[:size])

    @torch.inference_mode()
    def capture(self) -> None:
        """Every size's pieces, each after an eager warm-up at its size."""
        start = time.monotonic()
        pool = torch.cuda.graph_pool_handle()
        replaying = torch.cuda.current_stream(self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(replaying)
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):   # largest first: later sizes reuse its memory
                self.eager(size)
                with compile_watch.watching(compile_watch.CAPTURING):
                    self.pieces[size] = self._capture(size, pool)
        replaying.wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.monotonic() - start

    def _capture(self, size: int, pool) -> list[torch.cuda.CUDAGraph]:
        pieces = [torch.cuda.CUDAGraph()]
        breaks: list[Attention] = []

        def graph_break(layer: Attention, q, k, v, rope):
            """Ends the piece at this attention's inputs and begins the next at its output."""
            breaks.append(layer)
            if len(pieces) == 1:
                self.cos[:size].copy_(rope[0])
                self.sin[:size].copy_(rope[1])
            self.q[:size].copy_(q)
            self.k[:size].copy_(k)
            self.v[:size].copy_(v)
            pieces[-1].capture_end()
            pieces.append(torch.cuda.CUDAGraph())
            pieces[-1].capture_begin(pool=pool)
            return self.out[:size]

        for layer in self.layers:
            layer.graph_break = graph_break
        capturing = False
        try:
            pieces[0].capture_begin(pool=pool)
            capturing = True
            hidden = self.model(None, self.positions[..., :size], None,
                                inputs_embeds=self.embeds[:size])
            self.hidden[:size].copy_(hidden)
            del hidden
            pieces[-1].capture_end()
            capturing = False
        finally:
            for layer in self.layers:
                layer.graph_break = None
            if capturing:       # the stream must leave capture mode for anything to run
                pieces[-1].capture_end()
        if breaks != self.layers:   # replays run the attentions in self.layers' order
            raise RuntimeError(f"a prompt step's forward broke at {len(breaks)} attentions, not "
                               f"at its {len(self.layers)} attention layers in their order")
        return pieces

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """The model's hidden states [T, hidden] for a step of T <= max_size tokens (a view of
        the static output: consume it before the next replay)."""
        t = embeds.shape[0]
        size = padded_size(self.sizes, t)
        self.embeds[:t].copy_(embeds)
        self.positions[..., :t].copy_(positions)
        pieces = self.pieces[size]
        pieces[0].replay()
        # the step's rows of the buffers every attention shares, sliced once, not per layer
        q, k, v, out = self.q[:t], self.k[:t], self.v[:t], self.out[:t]
        rope = (self.cos[:t], self.sin[:t])
        for layer, piece in zip(self.layers, pieces[1:]):
            layer.attend(q, k, v, meta, rope, out=out)
            piece.replay()
        self.replays += 1
        return self.hidden[:t]

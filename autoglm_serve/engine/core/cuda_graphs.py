"""CUDA graphs for pure-decode steps.

At small batch a decode step is a few hundred small kernels whose launch gaps cost more than
their work; replaying a captured graph removes the gaps. One graph per padded batch size, all
reading the same static input buffers; a step of n decodes copies its inputs into the first n
rows, pads the rest (slot -1: no KV write; seq_len 0: nothing attended), and replays the graph of
the smallest captured size >= n. Logits are computed inside the graph too, into one buffer that
every graph writes its rows of: the graphs share one memory pool, where each graph's own logits
would stay allocated (at max_num_seqs 256, 2,191 rows over the 24 sizes: 664 MB of bf16 logits
for GLM's 151,552-token vocabulary, against 78 MB for the largest size alone).
"""
from __future__ import annotations

import logging
import time

import torch

from autoglm_serve.kernels import compile_watch
from autoglm_serve.models.layers.attention import AttentionMetadata

logger = logging.getLogger(__name__)


def padded_size(sizes: list[int], n: int) -> int | None:
    """The smallest captured size (ascending ``sizes``) that holds n rows; None past the last."""
    for s in sizes:
        if s >= n:
            return s
    return None


def capture_sizes(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(288, 1025, 32))
    return [s for s in sizes if s <= max_num_seqs] or [1]


class DecodeGraphs:
    def __init__(self, model, backend, device: torch.device, max_num_seqs: int,
                 max_blocks_per_seq: int, uses_mrope: bool):
        self.model = model
        self.backend = backend      # the Triton attention backend (graphs need it)
        self.device = device
        self.sizes = capture_sizes(max_num_seqs)
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros((3, n) if uses_mrope else (n,), dtype=torch.int64,
                                     device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: torch.Tensor | None = None     # [max_size, vocab], outside the graphs' pool
        self.capture_seconds = 0.0

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    def _meta(self, bs: int, max_seq_len: int) -> AttentionMetadata:
        cpu = torch.zeros(0)
        return AttentionMetadata(
            num_seqs=bs, num_decodes=bs, num_tokens=bs, max_query_len=1, max_seq_len=max_seq_len,
            query_start_loc=self.query_start_loc[:bs + 1], seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs], slot_mapping=self.slot_mapping[:bs],
            query_start_loc_cpu=cpu, seq_lens_cpu=cpu)

    def forward(self, bs: int, max_seq_len: int) -> torch.Tensor:
        """One eager decode step of the first bs rows of the static inputs: their logits."""
        pos = self.positions[..., :bs]
        hidden = self.model(self.input_ids[:bs], pos, self._meta(bs, max_seq_len))
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self, max_seq_len: int) -> None:
        start = time.monotonic()
        pool = torch.cuda.graph_pool_handle()
        self.seq_lens.fill_(1)   # a real context during capture; replays overwrite it
        replaying = torch.cuda.current_stream(self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(replaying)
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):   # largest first: later graphs reuse its memory
                # eager first, so that every kernel compiles outside the graph: a compile inside
                # the capture (a cold Triton cache) invalidated it and failed the engine's start.
                # Both decode-kernel variants: the one mixed steps run (their K/V written by the
                # write kernel; it compiled while serving otherwise, 1.0-1.4 s a split on the
                # H200) and the graph's own (the kernel writes the K/V itself).
                with self.backend.kv_write_kernel():
                    self.forward(bs, max_seq_len)
                eager = self.forward(bs, max_seq_len)
                if self.logits is None:     # the stream that replays owns it
                    with torch.cuda.stream(replaying):
                        self.logits = eager.new_empty(self.max_size, eager.shape[-1])
                del eager
                graph = torch.cuda.CUDAGraph()
                with compile_watch.watching(compile_watch.CAPTURING), \
                        torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.logits[:bs].copy_(self.forward(bs, max_seq_len))
                self.graphs[bs] = graph
        replaying.wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self.seq_lens.zero_()
        self.capture_seconds = time.monotonic() - start
        logger.info("captured %d decode CUDA graphs (batch 1..%d) in %.1f s",
                    len(self.sizes), self.max_size, self.capture_seconds)

    def padded_size(self, n: int) -> int | None:
        return padded_size(self.sizes, n)

    def load(self, n: int, input_ids, positions, slot_mapping, seq_lens, block_tables) -> None:
        """Host inputs of n decodes into the static buffers; rows up to the padded size get
        slot -1 and seq_len 0."""
        bs = self.padded_size(n)
        nb = block_tables.shape[1]
        # pinned sources: a copy from pageable memory would wait for the step in flight
        input_ids, positions, slot_mapping, seq_lens, block_tables = (
            t.pin_memory() for t in (input_ids, positions, slot_mapping, seq_lens, block_tables))
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[..., :n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        self.block_tables[:n, :nb].copy_(block_tables, non_blocking=True)
        if bs > n:
            self.slot_mapping[n:bs].fill_(-1)
            self.seq_lens[n:bs].zero_()

    def replay(self, n: int) -> torch.Tensor:
        """Logits [n, vocab] (a view of the graphs' output buffer: consume before the next
        replay)."""
        self.graphs[self.padded_size(n)].replay()
        return self.logits[:n]

"""The worst step a configuration allows, run part by part on the runner's model for its peak
memory (engine/core/memory_plan.py sizes the KV cache by it).

Each part is run alone with the allocator's peak reset before it: the largest image through the
vision tower (the runner encodes images one at a time), a forward over max_num_batched_tokens
tokens, and the sampler over max_num_seqs rows with every option that adds buffers. Where the
runner will capture decode CUDA graphs, a part prices what they keep for good once captured:
their shared pool holds the activations of the largest graph's step, and their logits buffer a
batch of that size (engine/core/cuda_graphs.py); an eager decode step at every graph size also
allocates the split-K workspaces of the GEMVs and GEMMs the graphs will use. The prompt steps'
piecewise graphs (engine/core/prompt_graphs.py) are captured and measured by what they reserve.

A part's figure is its peak above what it started from or leaves behind, whichever is more: what
it leaves (those workspaces) is in use when the memory plan reads the device's free memory.
"""
from __future__ import annotations

import torch

from autoglm_serve.multimodal.inputs import MultiModalItem
from autoglm_serve.engine.core.cuda_graphs import DecodeGraphs
from autoglm_serve.engine.core.prompt_graphs import prefill_meta
from autoglm_serve.engine.core.runner import ModelRunner
from autoglm_serve.engine.core.sampler import SamplingRow, make_generator
from autoglm_serve.sampling_params import MAX_LOGPROBS, SamplingParams

GRAPH_PARTS = ("decode graphs", "prompt graphs")   # held beside every step once captured


@torch.inference_mode()
def profile_worst_step(runner: ModelRunner, largest_image: MultiModalItem | None = None,
                       decode_graphs: bool = False, prompt_graphs: bool = False) -> dict[str, int]:
    """Each part's peak of allocated bytes, on CUDA (on a CPU the parts run and nothing is
    measured); GRAPH_PARTS (with ``decode_graphs``, ``prompt_graphs``) are held beside every
    step's peak. A part returns the bytes it will hold beyond its peak (None: nothing)."""
    parts = {"vision tower": (lambda: _vision_tower(runner, largest_image))
             if largest_image is not None else None,
             "forward": lambda: _forward(runner), "sampler": lambda: _sampler(runner),
             "decode graphs": (lambda: _decode_graphs(runner)) if decode_graphs else None,
             "prompt graphs": (lambda: _prompt_graphs(runner)) if prompt_graphs else None}
    if runner.device.type == "cuda":
        # the penalties' count table and prompt mask, persistent: held before the KV cache
        # is sized from what is left
        runner.token_counts.reserve(runner.max_num_seqs)
    peaks = {}
    for name, run in parts.items():
        if run is None:
            continue
        cuda = runner.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(runner.device)
            torch.cuda.reset_peak_memory_stats(runner.device)
            start = torch.cuda.memory_allocated(runner.device)
        held = run() or 0
        if cuda:
            torch.cuda.synchronize(runner.device)
            left = max(start, torch.cuda.memory_allocated(runner.device))
            peaks[name] = torch.cuda.max_memory_allocated(runner.device) - left + held
    return peaks


def _vision_tower(self: ModelRunner, image: MultiModalItem) -> None:
    self.model.embed_images(image.patches(self.device), [image.grid_thw])


def _forward(self: ModelRunner) -> None:
    """A prefill of max_num_batched_tokens tokens, in sequences of at most max_model_len."""
    n = self.max_num_tokens
    meta = prefill_meta(n, self.max_model_len, self.max_blocks_per_seq, self.device)
    ids = torch.zeros(n, dtype=torch.int64, device=self.device)
    pos = torch.arange(n, device=self.device) % self.max_model_len
    if self.uses_mrope:
        pos = pos.expand(3, -1)
    hidden = self.model(ids, pos, meta)
    self.model.compute_logits(hidden[:min(n, self.max_num_seqs)])


def _decode_graphs(self: ModelRunner) -> int:
    """An eager decode step at each of the graphs' sizes; returns the bytes of the logits
    buffer the graphs add to what the largest step needs."""
    graphs = DecodeGraphs(self.model, self.backend, self.device, self.max_num_seqs,
                          self.max_blocks_per_seq, self.uses_mrope)
    graphs.seq_lens.fill_(1)    # as the capture does
    for bs in graphs.sizes:
        row_bytes = graphs.forward(bs, self.max_model_len)[0].nbytes   # freed at once
    return graphs.max_size * row_bytes


def _prompt_graphs(self: ModelRunner) -> int | None:
    """The pieces captured at every size, then dropped: what they reserve (static buffers, and
    the pool, which keeps the allocator's rounding of each block its capture made: 1.4x an
    eager forward's peak of the largest size, on the H100) is the part's figure. On a CPU, an
    eager forward over the static buffers, measuring nothing."""
    if self.device.type != "cuda":
        graphs = self.new_prompt_graphs()
        graphs.eager(graphs.max_size)
        return None
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(self.device)
    graphs = self.new_prompt_graphs()
    graphs.capture()
    torch.cuda.empty_cache()    # the warm-ups' blocks go; the graphs' pool stays
    reserved = torch.cuda.memory_reserved(self.device) - before
    del graphs
    torch.cuda.empty_cache()
    # the figure is what the capture reserved, not the allocations it peaked at
    torch.cuda.reset_peak_memory_stats(self.device)
    return reserved


def _sampler(self: ModelRunner) -> None:
    """max_num_seqs rows of random logits through every sampling option, with the penalties'
    history as the runner gathers it for them ([rows, V] counts and prompt mask,
    engine/core/token_counts.py)."""
    rows, vocab = self.max_num_seqs, self.vocab_size
    logits = torch.randn(rows, vocab, device=self.device)
    history = (torch.zeros(rows, vocab, dtype=torch.float32, device=self.device),
               torch.zeros(rows, vocab, dtype=torch.bool, device=self.device))
    params = SamplingParams(temperature=1.0, top_p=0.85, min_p=0.01, repetition_penalty=1.1,
                            frequency_penalty=0.2, logprobs=MAX_LOGPROBS, min_tokens=1)
    prompt = range(self.max_model_len // 2)
    output = range(self.max_model_len // 2, self.max_model_len - 1)
    self.sampler.sample(logits, [SamplingRow(params, prompt, output,
                                             make_generator(i, self.device), (0,))
                                 for i in range(rows)], history)

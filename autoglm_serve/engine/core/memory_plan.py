"""How much memory the KV cache gets, from what the worst step of this configuration needs.

On a GPU the KV cache takes what is left of the process' share of the device (the smaller of
--gpu-memory-utilization and a torch.cuda.set_per_process_memory_fraction cap) once the weights,
the encoder cache's full budget and the peak activations of the worst step are counted. The
worst step is measured, not guessed (engine/core/worst_step.py): the largest image the image
settings allow through the vision tower, a forward over max_num_batched_tokens, and the sampler
at max_num_seqs rows with every buffer it can build; what the CUDA graphs (decode, and prompt
steps' pieces) keep once captured is measured there too and held beside it. A configuration
that leaves the KV cache too small for one max_model_len request fails the start with the
breakdown and what would fit.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.core.image_embedding import encoder_cache_bytes
from autoglm_serve.engine.core.model_setup import LoadedModel
from autoglm_serve.engine.core.runner import ModelRunner
from autoglm_serve.engine.core.sampler import group_elements_for
from autoglm_serve.engine.core.worst_step import GRAPH_PARTS, profile_worst_step
from autoglm_serve.loader.model_path import processor_defaults
from autoglm_serve.multimodal.inputs import MultiModalItem

logger = logging.getLogger(__name__)

CPU_DEFAULT_KV_GIB = 2.0


@dataclass
class CacheSizing:
    num_blocks: int
    block_size: int
    bytes_per_block: int
    activation_bytes: int = 0
    breakdown: str = ""         # where the device's memory went, for the start-up log

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size


def size_kv_cache(config: EngineConfig, runner: ModelRunner, device: torch.device,
                  max_model_len: int, loaded: LoadedModel) -> CacheSizing:
    per_block = runner.kv_bytes_per_block()
    bs = config.block_size
    if config.num_kv_blocks is not None:
        return CacheSizing(config.num_kv_blocks, bs, per_block)
    if config.kv_cache_memory_gib or device.type != "cuda":
        gib = config.kv_cache_memory_gib or CPU_DEFAULT_KV_GIB
        sizing = CacheSizing(int(gib * 2**30) // per_block, bs, per_block)
    else:
        sizing = _profile_cuda(config, runner, device, loaded, per_block)
    if sizing.num_tokens < max_model_len:
        raise ValueError(
            f"the KV cache holds {sizing.num_tokens} tokens, fewer than max_model_len="
            f"{max_model_len}{' (' + sizing.breakdown + ')' if sizing.breakdown else ''}: "
            "lower --max-model-len, --max-num-batched-tokens or --max-num-seqs, lower "
            "max_pixels in --mm-processor-kwargs, or give the cache more memory "
            "(--gpu-memory-utilization, --kv-cache-memory-gib, a quantized checkpoint)")
    return sizing


def _profile_cuda(config: EngineConfig, runner: ModelRunner, device: torch.device,
                  loaded: LoadedModel, per_block: int) -> CacheSizing:
    torch.cuda.empty_cache()
    total = torch.cuda.mem_get_info(device)[1]
    limit = total * min(config.gpu_memory_utilization, _memory_fraction(device))
    runner.sampler.group_elements = group_elements_for(limit)
    runner.allocate_kv_cache(1)
    image = largest_image(config, loaded) if runner.images is not None else None
    peaks = profile_worst_step(runner, image, decode_graphs=runner.wants_cuda_graphs(config),
                               prompt_graphs=runner.wants_prompt_graphs(config))
    # held once captured, beside every step
    graphs = sum(peaks.get(part, 0) for part in GRAPH_PARTS)
    activation = max(v for k, v in peaks.items() if k not in GRAPH_PARTS) + graphs
    if image is not None:
        # an image's encoding in progress is held across steps, beside any step's peak
        peaks["vision state"] = runner.images.state_bytes(image)
        activation += peaks["vision state"]
    logger.info("the worst step's activations: %s (the sampler in groups of %d rows)", ", ".join(
        f"{name} {peak / 2**30:.2f} GiB" for name, peak in peaks.items()),
        max(1, runner.sampler.group_elements // runner.vocab_size))
    runner.allocate_kv_cache(0)
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info(device)[0]
    used = total - free
    encoder = encoder_cache_bytes(runner.model, runner.encoder_cache, device)
    budget = max(0, int(limit - used - activation - encoder))
    breakdown = (f"of {limit / 2**30:.2f} GiB: {used / 2**30:.2f} GiB weights and runtime, "
                 f"{activation / 2**30:.2f} GiB the worst step's activations and the CUDA "
                 f"graphs ({graphs / 2**30:.2f} GiB of it), "
                 f"{encoder / 2**30:.2f} GiB the encoder cache, {budget / 2**30:.2f} GiB "
                 "the KV cache")
    logger.info("memory %s", breakdown)
    return CacheSizing(budget // per_block, config.block_size, per_block, activation, breakdown)


def _memory_fraction(device: torch.device) -> float:
    """The cap set by torch.cuda.set_per_process_memory_fraction (1.0 when none): a smaller
    card simulated on a large one, or a GPU shared on purpose."""
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)   # torch >= 2.9
    if get is None:
        return 1.0
    return float(get(device.index if device.index is not None else torch.cuda.current_device()))


def image_processor(config: EngineConfig, loaded: LoadedModel):
    """The server's image settings (--mm-processor-kwargs over the checkpoint's)."""
    from autoglm_serve.multimodal.processor import MultiModalProcessor
    path = loaded.resolved.path
    return MultiModalProcessor(loaded.hf_config, path if path.is_dir() else None,
                               {**processor_defaults(loaded.resolved), **config.mm_processor_kwargs})


def largest_image(config: EngineConfig, loaded: LoadedModel) -> MultiModalItem:
    """The image with the most patches the image settings allow, as a request's would come:
    sides that are multiples of the patch grid's factor, whose area (both
    frames of a still image, as smart_resize counts it) is at most max_pixels."""
    from PIL import Image
    processor = image_processor(config, loaded)
    cfg = processor.image_processor.config
    factor, frames = cfg.patch_size * cfg.merge_size, cfg.temporal_patch_size
    most = cfg.max_pixels // (frames * factor * factor)   # in factor x factor cells
    # the most cells in a shape no longer than 4:1 (within a few percent of any shape's most)
    rows = max((r for r in range(1, int(most ** 0.5) + 1) if most // r <= 4 * r),
               key=lambda r: r * (most // r))
    size = (factor * (most // rows), factor * rows)
    prompt = processor.build([loaded.hf_config.image_token_id], [Image.new("RGB", size)])
    return prompt.items[0]

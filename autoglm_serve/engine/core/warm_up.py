"""Start-up warm-up of an engine core: the shapes a server meets first, run once, so Triton
compiles and cuDNN plans now rather than under the first user requests."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from autoglm_serve.engine.core.linear_warm_up import warm_up_linears
from autoglm_serve.engine.core.memory_plan import image_processor
from autoglm_serve.engine.core.request import Request
from autoglm_serve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from autoglm_serve.engine.core.engine_core import EngineCore

logger = logging.getLogger("autoglm_serve.engine.core.engine_core")


def warm_up(self: EngineCore) -> None:
    """Runs the shapes a server meets first (lone and batched prefills, mixed steps, a
    prefix-cache hit, and for a vision model one phone screenshot) so Triton compiles its
    kernel variants and cuDNN plans its attention now, not during the first user requests
    (a compile costs about a second of TTFT); on a GPU, first the linear layers at every row
    count, so that CUDA loads their GEMM kernels now (linear_warm_up.py)."""
    start = time.monotonic()
    if self.device.type == "cuda":
        linears_s = warm_up_linears(self.loaded.model, self.loaded.dtype,
                                    self.max_num_batched_tokens, self.config.max_num_seqs)
        logger.info("the linear layers at every row count in %.1f s", linears_s)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    # Triton specializes the decode GEMVs' row count when it is a multiple of 16, so the
    # 16-row CUDA graph compiles only that variant, and eager steps of 9-15 rows compiled the
    # others while serving (1.2 s on the H200): [11] runs the linears at 11 rows (a phone
    # agent's short text before its screenshot), [2] * 11 the LM head (eleven rows sampled in
    # a mixed step; one-token prompts would run as a decode graph). The last [48] hits the
    # prefix cache.
    lengths = [[17], [11], [2] * 11, [5, 16, 33, 1], [48], [48]]
    for i, group in enumerate(lengths):
        for j, n in enumerate(group):
            if n + 3 >= self.max_model_len:
                continue
            ids = [(7 * k + j) % self.vocab_size for k in range(n)]
            self.add_request(Request(f"warmup-{i}-{j}", ids, params, frozenset(), 3))
        while self.has_unfinished():
            self.step()
    if self.runner.encoder_cache is not None:
        _warm_up_screenshot(self, params)
    self.kv.reset_prefix_cache()
    self.kv.prefix_queries = self.kv.prefix_hits = 0
    self.num_prompt_tokens_total = self.num_generation_tokens_total = 0
    self.scheduler.num_preemptions = 0
    logger.info("warm-up in %.1f s", time.monotonic() - start)

def _warm_up_screenshot(self: EngineCore, params) -> None:
    """A blank 1080x2400 screenshot, sized by the server's own image settings (the common
    phone agent's first request), through the vision tower and the prefill."""
    from PIL import Image
    processor = image_processor(self.config, self.loaded)
    prompt = processor.build([self.loaded.hf_config.image_token_id, 0, 1],
                             [Image.new("RGB", (1080, 2400), (255, 255, 255))])
    if len(prompt.token_ids) + 3 >= self.max_model_len:
        return
    positions, delta = prompt.mrope
    self.add_request(Request("warmup-screenshot", prompt.token_ids, params, frozenset(), 3,
                             mm_items=prompt.items, mrope_positions=positions,
                             mrope_delta=delta))
    while self.has_unfinished():
        self.step()
    self.runner.encoder_cache.clear()

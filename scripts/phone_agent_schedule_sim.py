#!/usr/bin/env python
"""The phone-agent load through the engine's own Scheduler and KV manager on a simulated clock:
what the scheduling policy alone does to TTFT and agent steps/s, on a CPU in seconds.

    python scripts/phone_agent_schedule_sim.py [--agents 16,64] [--steps 5]
        [--decode-step-tokens none,896]

Each agent sends its turns one after another, as `bench serve --dataset phone-agent` does: a
shared system prompt, the history, one screenshot (3,108 placeholder tokens) and the screen's
text; once a turn has its 128 tokens, the screenshot leaves the history and the reply joins it.
The core's loop is the engine's (engine_core.py): the step's budget is 2,048 tokens, or
``--decode-step-tokens`` while a request decodes; the encoder gets what the running requests
leave of it, for the image `image_to_encode` names, a block at a time; then `schedule` takes
the rest. A step's time is a cost model fitted to an H100's step traces of this load in bf16
(BENCHMARKS.md, thirty-ninth session: a step's wait against what the step before it carried):
5.6 ms, plus 0.17 ms a decode row, plus 0.029 ms a prompt token or vision token-equivalent (a
screenshot: 2,514 of them, 24 blocks and the merger). It is a mean: the measured steps spread
~10% around it. Two tokenizers: the GPU bench's stand-in byte tokenizer (a ~4,700-token
system prompt, replies ~4x their tokens once re-tokenized) and GLM's (~1,000, 1x). Prints one
line a point, with the gaps between a request's tokens (a decoding request waits one step a
token: over 40 ms is the issue's target); the device figures are the GPU bench's
(scripts/gpu/phone_agent_bench.py).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoglm_serve.engine.core.image_encoder import blocks_to_run  # noqa: E402
from autoglm_serve.engine.core.kv_cache import KVCacheManager  # noqa: E402
from autoglm_serve.engine.core.request import Request, RequestStatus  # noqa: E402
from autoglm_serve.engine.core.scheduler import Scheduler  # noqa: E402
from autoglm_serve.multimodal.inputs import MultiModalItem  # noqa: E402
from autoglm_serve.sampling_params import SamplingParams  # noqa: E402

STEP_TOKENS = 2048
# a screenshot's 24 vision blocks and its merger, in token-equivalents of FLOPs as the engine
# prices them (Glm4vVisionTower.block_flops and finish_flops over flops_per_text_token)
IMAGE_TOKENS, IMAGE_BLOCKS, BLOCK_COST, MERGER_COST = 3108, 24, 101.4, 80.1
IMAGE_TOKEN = 151343
TOKENIZERS = {"byte": (4700, 4), "glm": (1000, 1)}   # system prompt tokens, reply expansion


def step_ms(decode_rows: int, prompt_tokens: int, vision_tokens: float) -> float:
    return 5.6 + 0.17 * decode_rows + 0.029 * (prompt_tokens + vision_tokens)


class Agents:
    """The agents' conversations as token ids (distinct ids per agent and turn, so only the
    system prompt and an agent's own history hit the prefix cache)."""

    def __init__(self, agents: int, steps: int, system_tokens: int, reply_expansion: int,
                 output_len: int):
        self.steps, self.output_len, self.reply_expansion = steps, output_len, reply_expansion
        self.history = {a: list(range(1000, 1000 + system_tokens)) for a in range(agents)}
        self.turn = dict.fromkeys(range(agents), 0)
        self.text_after = {}

    def request(self, agent: int, now: float) -> Request:
        k = self.turn[agent]
        before = self.history[agent] + [200_000 + agent * 1000 + k * 10 + j for j in range(8)]
        after = [300_000 + agent * 1000 + k * 10 + j for j in range(40)]
        req = Request(f"{agent}-{k}", before + [IMAGE_TOKEN] * IMAGE_TOKENS + after,
                      SamplingParams(), frozenset(), max_tokens=self.output_len, arrival_time=now)
        req.mm_items = [MultiModalItem(f"image-{agent}-{k}", len(before), IMAGE_TOKENS,
                                       torch.zeros(1, 1), (1, 2, 2))]
        self.text_after[req.request_id] = (agent, after)
        return req

    def answered(self, req: Request) -> int | None:
        """The screenshot leaves the history, the reply joins it; the agent's next turn, if any."""
        agent, after = self.text_after.pop(req.request_id)
        k = self.turn[agent]
        reply = [400_000 + agent * 1000 + k * 10 + j % 10 + 100 * (j // 10)
                 for j in range(self.output_len * self.reply_expansion)]
        self.history[agent] = req.prompt_token_ids[:req.mm_items[0].offset] + after + reply
        self.turn[agent] += 1
        return agent if self.turn[agent] < self.steps else None


def simulate(agents: int, steps: int, tokenizer: str, output_len: int = 128,
             kv_blocks: int = 60_000, decode_step_tokens: int | None = None) -> dict:
    encoded: set[str] = set()
    scheduler = Scheduler(KVCacheManager(kv_blocks, 16), 256, STEP_TOKENS,
                          image_ready=lambda item: item.content_hash in encoded,
                          decode_step_tokens=decode_step_tokens)
    conversations = Agents(agents, steps, *TOKENIZERS[tokenizer], output_len)
    now, ttfts, turns_done = 0.0, [], 0
    in_progress = None      # the image whose blocks are part run
    blocks_left = 0         # ...and how many of its blocks are left
    restarts = 0            # images begun while another's blocks were part run (lost work)
    last_token_at: dict[str, float] = {}
    gaps_ms = []            # between one request's tokens

    def send(agent: int) -> None:
        scheduler.add(conversations.request(agent, now))

    for agent in range(agents):
        send(agent)
    while scheduler.has_unfinished():
        budget = scheduler.step_budget()
        vision = 0.0
        todo = scheduler.image_to_encode(in_progress)
        left = budget - scheduler.tokens_owed_by_running() if todo else 0
        if todo and left > 0:
            key = todo[1].content_hash
            if key != in_progress:      # as ImageEncoder.encode: another image starts over
                restarts += in_progress is not None
                blocks_left = IMAGE_BLOCKS
            n = blocks_to_run(blocks_left, left, BLOCK_COST, MERGER_COST)
            blocks_left -= n
            vision = n * BLOCK_COST + (MERGER_COST if not blocks_left else 0)
            in_progress = key if blocks_left else None
            if in_progress is None:
                encoded.add(key)
        # as EngineCore._encode_images: the blocks run may cost more than was left (at least
        # one runs), but the step's prompts lose only what was left
        out = scheduler.schedule(budget - min(math.ceil(vision), max(left, 0)))
        if out.is_empty and not vision:
            raise RuntimeError("the scheduler stalled")
        scheduler.update_after_launch(out.scheduled)
        rows = sum(1 for s in out.scheduled if s.num_new_tokens == 1)
        now += step_ms(rows, out.num_batched_tokens - rows, vision) / 1e3
        for s in out.scheduled:
            req = s.request
            if not req.num_inflight:
                continue
            req.land_token(7)
            if req.request_id in last_token_at:
                gaps_ms.append(1e3 * (now - last_token_at[req.request_id]))
            last_token_at[req.request_id] = now
            if len(req.output_token_ids) == 1:
                ttfts.append(now - req.arrival_time)
            if len(req.output_token_ids) == req.max_tokens:
                scheduler.finish(req, RequestStatus.FINISHED_LENGTH)
                del last_token_at[req.request_id]
                turns_done += 1
                nxt = conversations.answered(req)
                if nxt is not None:
                    send(nxt)
    ttfts.sort()
    gaps_ms.sort()
    return dict(agents=agents, tokenizer=tokenizer, decode_step_tokens=decode_step_tokens,
                turns=turns_done,
                agent_steps_per_s=round(turns_done / now, 2),
                ttft_p50_s=round(ttfts[len(ttfts) // 2], 2),
                ttft_p99_s=round(_p99(ttfts), 2),
                ttft_max_s=round(ttfts[-1], 2), simulated_s=round(now, 1),
                images_restarted=restarts,
                itl_p99_ms=round(_p99(gaps_ms), 1), itl_max_ms=round(gaps_ms[-1], 1),
                gaps_over_40ms=sum(1 for g in gaps_ms if g > 40))


def _p99(sorted_values: list[float]) -> float:
    return sorted_values[int(0.99 * (len(sorted_values) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", default="16,64")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tokenizers", default="byte,glm")
    ap.add_argument("--decode-step-tokens", default="none",
                    help="budgets while requests decode, comma-separated (none: 2,048)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    budgets = [None if b == "none" else int(b) for b in args.decode_step_tokens.split(",")]
    for agents in (int(a) for a in args.agents.split(",")):
        for tokenizer in args.tokenizers.split(","):
            for budget in budgets:
                print(json.dumps(simulate(agents, args.steps, tokenizer,
                                          decode_step_tokens=budget)), flush=True)


if __name__ == "__main__":
    main()

"""The phone-agent workload: simulated agents running multi-step episodes like Open-AutoGLM.

Each agent keeps one conversation: a long system prompt, then per step a user turn with a fresh
1080×2400 screenshot (base64 PNG) and screen info, then the model's reply appended to the history.
As in Open-AutoGLM, the screenshot of a step is removed from the history once the model has
answered, so every request carries exactly one image and a text history that grows. Steps of one
agent are sequential (the next screen depends on the action); agents run concurrently.
"""

from __future__ import annotations

import asyncio
import copy
import multiprocessing
import os
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import httpx

from autoglm_serve.bench.client import ClientConfig, send_request
from autoglm_serve.bench.datasets import BenchRequest
from autoglm_serve.bench.record import RequestRecord
from autoglm_serve.bench.screenshots import screenshot_png_base64

# Written for this benchmark in the style of phone-agent prompts: what matters is its length
# (a few thousand characters, shared by every request, so prefix caching can pay off).
SYSTEM_PROMPT = """You are a phone operating agent. You see the current screen of an Android phone as a \
screenshot and you complete the user's task by issuing one action per step. Think about the screen \
before acting. Reply in exactly this format:
<think>your reasoning about the current screen, what changed since the last step and what to do next</think>
<answer>one action from the list below</answer>

Coordinates are relative: x and y run from 0 (left/top) to 999 (right/bottom) whatever the resolution.

Actions:
- do(action="Launch", app="NAME"): open an installed app by its name. Prefer this to searching the home screen.
- do(action="Tap", element=[x, y]): tap the centre of an element.
- do(action="Tap", element=[x, y], message="important"): tap an element that spends money, sends a message or deletes data; the user is asked to confirm first.
- do(action="Type", text="TEXT"): type into the focused input field. Focus the field with a tap first and clear old text if needed.
- do(action="Swipe", start=[x1, y1], end=[x2, y2]): scroll or swipe. To see more of a list, swipe from the lower part of the screen upwards.
- do(action="Long Press", element=[x, y]): press and hold an element, for context menus.
- do(action="Double Tap", element=[x, y]): zoom or like.
- do(action="Back"): go back one screen or close a dialog.
- do(action="Home"): go to the home screen.
- do(action="Wait", duration="2 seconds"): wait for a page to load.
- do(action="Take_over", message="REASON"): ask the user to act, for logins, captchas or payments.
- finish(message="SUMMARY"): the task is done or cannot be done; say what happened.

Rules:
1. Before anything else, check that the app in the foreground is the one the task needs. If not, launch it.
2. If the screen is loading or blank, wait at most three times, then go back and try another way.
3. If an element you need is not visible, scroll to look for it before concluding it does not exist.
4. If a search gives no result, try a shorter or different keyword once, then report.
5. Never repeat the same action on the same element more than twice in a row; if nothing changes, change strategy.
6. Fill forms top to bottom; check each field after typing.
7. When a permission or update dialog appears, dismiss it unless the task needs it.
8. When the task names a quantity, size, date or person, check it on the screen before confirming.
9. For shopping, add items to the cart and stop at the payment page unless told to pay.
10. For messages, read the whole conversation before replying, and send exactly the text asked for.
11. For navigation, confirm the destination and the transport mode before starting.
12. When the task is ambiguous, choose the most common interpretation and say so in finish().
13. Keep your reasoning short and about the current screen: what is visible, what you expect after the action.
14. Report what was done in finish(), including anything that could not be done and why.
15. Do not invent elements: act only on what the screenshot shows.
16. Stop as soon as the task is complete; extra actions can undo the result.
17. Coordinates must point inside the element, away from its edges, so that a slightly shifted tap still hits it.
18. Text fields may hide behind the keyboard: after typing, close the keyboard with Back if it covers the next element.
19. Lists may be long: remember which items you have already checked so that you do not scroll in circles.
20. A red or highlighted badge means unread content; open it when the task is about new messages or notifications.
"""

TASKS = [
    "Open the weather app and tell me whether it will rain in Hangzhou tomorrow.",
    "Order a large latte with oat milk from the nearest coffee shop for pickup.",
    "Send the message 'running ten minutes late' to Li Wei in the chat app.",
    "Find the cheapest flight from Beijing to Shenzhen next Friday and stop at payment.",
    "Turn on Bluetooth and connect to the headphones called Buds Pro.",
    "Set an alarm for 6:45 tomorrow morning labelled 'gym'.",
    "Search the shopping app for a 20000 mAh power bank and add the best-rated one to the cart.",
    "Book a taxi from home to the railway station leaving at 8 am.",
]

REPLY_ACTIONS = ['do(action="Tap", element=[{x}, {y}])', 'do(action="Swipe", start=[500, 800], '
                 'end=[500, 200])', 'do(action="Back")', 'do(action="Launch", app="Settings")']


@dataclass
class PhoneEpisode:
    """The conversation of one simulated agent."""

    agent: int
    task: str
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages = [{"role": "system", "content": SYSTEM_PROMPT}]

    def add_screen(self, step: int, image_b64: str) -> list[dict[str, Any]]:
        """Append this step's user turn (screenshot + text); return the messages to send."""
        screen_info = f'** Screen Info **\n{{"current_app": "app-{(self.agent + step) % 7}", "step": {step}}}'
        text = f"{self.task}\n\n{screen_info}" if step == 0 else screen_info
        self.messages.append({
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image_b64}"}},
                {"type": "text", "text": text},
            ],
        })
        return copy.deepcopy(self.messages)

    def add_reply(self, reply: str) -> None:
        """Drop the screenshot from the last user turn and append the model's reply."""
        last = self.messages[-1]
        if last["role"] == "user" and isinstance(last["content"], list):
            last["content"] = [p for p in last["content"] if p.get("type") != "image_url"]
        self.messages.append({"role": "assistant", "content": reply})

    def text_chars(self) -> int:
        total = 0
        for m in self.messages:
            c = m["content"]
            total += len(c) if isinstance(c, str) else sum(len(p.get("text", "")) for p in c)
        return total


def image_count(messages: list[dict[str, Any]]) -> int:
    return sum(
        1 for m in messages if isinstance(m["content"], list)
        for p in m["content"] if p.get("type") == "image_url"
    )


def fallback_reply(agent: int, step: int) -> str:
    """A well-formed agent reply, used in the history when the model's text is empty."""
    rnd = random.Random(agent * 1000 + step)
    action = rnd.choice(REPLY_ACTIONS).format(x=rnd.randint(50, 950), y=rnd.randint(50, 950))
    return f"<think>The screen shows step {step}; acting.</think><answer>{action}</answer>"


# Open-AutoGLM's PNGs (level 6) take ~0.2 s a screenshot to draw and encode on one core: 64
# agents x 5 steps would wait a minute before a run. Processes draw them (16 screenshots on two
# cores: 3.4 s in one process, 1.9 in two; two threads gained 1.3x).
_RENDER_IN_PROCESSES_FROM = 8


def _render(seed: int, keys: list[tuple[int, int]]) -> Iterator[str]:
    """The screenshots of (agent, step) keys, in order; in a process a core where there are many."""
    workers = min(len(keys), os.cpu_count() or 1)
    # forked workers, where fork is safe (macOS's system frameworks are not, after threads)
    if len(keys) < _RENDER_IN_PROCESSES_FROM or workers < 2 or sys.platform != "linux":
        yield from (screenshot_png_base64(seed, agent, step) for agent, step in keys)
        return
    # not spawned: a spawned worker would run the caller's __main__ again (a script without a
    # __name__ guard would start over); the workers only draw and encode
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        yield from pool.map(screenshot_png_base64, [seed] * len(keys), *zip(*keys),
                            chunksize=max(1, len(keys) // (4 * workers)))


@dataclass
class PhoneAgentWorkload:
    agents: int
    steps: int
    output_len: int = 128
    seed: int = 0
    step_delay_s: float = 0.0  # time the phone takes to act between steps
    # Screenshots are rendered before the run so that drawing them never counts as latency.
    screenshots: dict[tuple[int, int], str] = field(default_factory=dict, repr=False)

    def prepare(self, progress: Callable[[int], None] | None = None) -> None:
        keys = [(agent, step) for agent in range(self.agents) for step in range(self.steps)]
        missing = [key for key in keys if key not in self.screenshots]
        if progress:
            progress(len(keys) - len(missing))
        for key, shot in zip(missing, _render(self.seed, missing)):
            self.screenshots[key] = shot
            if progress:
                progress(1)

    @property
    def num_requests(self) -> int:
        return self.agents * self.steps

    def episode(self, agent: int) -> PhoneEpisode:
        return PhoneEpisode(agent, TASKS[(agent + self.seed) % len(TASKS)])


async def run_agent(
    http: httpx.AsyncClient,
    cfg: ClientConfig,
    workload: PhoneAgentWorkload,
    agent: int,
    limiter: asyncio.Semaphore | None,
    on_done: Callable[[RequestRecord], None],
) -> list[RequestRecord]:
    """Run one episode. A failed step ends the episode: the next screen would depend on it."""
    episode = workload.episode(agent)
    records: list[RequestRecord] = []
    for step in range(workload.steps):
        messages = episode.add_screen(step, workload.screenshots[(agent, step)])
        text = messages[-1]["content"][-1]["text"]
        # Prompt length: the server's usage replaces this rough text-only estimate (~4 chars a
        # token; the image's tokens are unknown to the client).
        req = BenchRequest(prompt=text, prompt_len=episode.text_chars() // 4,
                           output_len=workload.output_len, messages=messages)
        if limiter is not None:
            async with limiter:
                rec = await send_request(http, cfg, req, agent * workload.steps + step)
        else:
            rec = await send_request(http, cfg, req, agent * workload.steps + step)
        rec.agent, rec.step = agent, step
        records.append(rec)
        on_done(rec)
        if not rec.success:
            break
        episode.add_reply(rec.generated_text or fallback_reply(agent, step))
        if workload.step_delay_s > 0:
            await asyncio.sleep(workload.step_delay_s)
    return records


def episodes_completed(records: list[RequestRecord], steps: int) -> int:
    done: dict[int, int] = {}
    for r in records:
        if r.success and r.agent is not None:
            done[r.agent] = done.get(r.agent, 0) + 1
    return sum(1 for n in done.values() if n == steps)


def latency_by_step(records: list[RequestRecord]) -> dict[int, float]:
    """Mean E2E latency (ms) per step index: shows what the growing history costs."""
    by_step: dict[int, list[float]] = {}
    for r in records:
        if r.success and r.step is not None and r.e2el is not None:
            by_step.setdefault(r.step, []).append(r.e2el * 1000.0)
    return {s: sum(v) / len(v) for s, v in sorted(by_step.items())}

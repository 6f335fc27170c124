"""The built-in calibration set: short phone-agent and assistant conversations, rendered with the
model's own chat template (for a vision model each agent turn carries a synthetic screenshot),
and every third sample a plain document without any template.

Why documents: the first token of a sequence carries the model's largest activations (the
attention sink), so it dominates GPTQ's X^T X; with every sample opening on the chat template's
same first token, the layers are tuned to that one sink and not to text that starts otherwise
(SmolLM2, GPTQ group 32 with zero points, perplexity on prose: 16 chats +13.7%, with 31
documents beside them +11.6%; 24 samples of the all-chat set +14.1%, of this one +12.0%; but 16
of this one +15.4%: sets of this size move it by a few points either way. Ignoring every
sample's first token instead: +91%).

Deterministic (a function of the sample count and the model's tokenizer) and bounded: at most
`max_tokens` text tokens a sample, screenshots downscaled to `max_pixels`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from autoglm_serve.bench.phone_agent import SYSTEM_PROMPT, TASKS, fallback_reply
from autoglm_serve.quantize.calibration_documents import DOCUMENTS
from autoglm_serve.quantize.calibration_texts import LONG_TURNS, SHORT_TURNS
from autoglm_serve.quantize.methods import DEFAULT_NUM_SAMPLES


@dataclass
class CalibrationSample:
    input_ids: torch.Tensor                 # [1, T]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    mm_token_type_ids: torch.Tensor | None = None   # 1 at image tokens (transformers' M-RoPE needs it)

    def model_inputs(self) -> dict[str, torch.Tensor]:
        inputs = {"input_ids": self.input_ids}
        if self.pixel_values is not None:
            inputs.update(pixel_values=self.pixel_values, image_grid_thw=self.image_grid_thw,
                          mm_token_type_ids=self.mm_token_type_ids)
        return inputs

    def to(self, device: str) -> "CalibrationSample":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return CalibrationSample(move(self.input_ids), move(self.pixel_values),
                                 move(self.image_grid_thw), move(self.mm_token_type_ids))


def conversations(num_samples: int, with_images: bool) -> list[list[dict]]:
    """Alternating agent steps and prose chats; an agent step's user turn holds one image part."""
    rnd = random.Random(0)
    out = []
    for i in range(num_samples):
        if i % 2 == 0:
            agent, step = i // 2, rnd.randint(0, 3)
            task = TASKS[agent % len(TASKS)]
            text = f'{task}\n\n** Screen Info **\n{{"current_app": "app-{agent % 7}", "step": {step}}}'
            user = [{"type": "image"}, {"type": "text", "text": text}] if with_images else text
            # a different slice of the agent's system prompt per sample: the same text in every
            # sample would dominate the statistics (measured: GPTQ then loses to RTN on prose)
            start = rnd.randint(0, len(SYSTEM_PROMPT) - 800)
            system = SYSTEM_PROMPT[start: start + 300 + rnd.randint(0, 500)]
            out.append([{"role": "system", "content": system},
                        {"role": "user", "content": user},
                        {"role": "assistant", "content": fallback_reply(agent, step)}])
        else:
            # a multi-turn chat of prose answers: several topics a sample, so that no one text
            # (nor the chat template's default system prompt) dominates the statistics
            j = i // 2
            turns = [LONG_TURNS[(3 * j + k) % len(LONG_TURNS)] for k in range(3)]
            turns.insert(rnd.randint(0, 3), SHORT_TURNS[j % len(SHORT_TURNS)])
            chat = []
            for question, answer in turns:
                chat += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            out.append(chat)
    return out


def calibration_samples(tokenizer, num_samples: int = DEFAULT_NUM_SAMPLES, max_tokens: int = 512,
                        image_dir=None, image_token_id: int | None = None,
                        max_pixels: int = 500_000) -> list[CalibrationSample]:
    """`image_dir` (the checkpoint's preprocessor config) and `image_token_id` turn screenshots
    on: a vision model is calibrated on the image tokens it will see."""
    with_images = image_token_id is not None
    processor = None
    if with_images:
        from autoglm_serve.multimodal.image_processor import Glm4vImageProcessor
        processor = Glm4vImageProcessor.from_pretrained(image_dir, max_pixels=max_pixels)
    num_documents = num_samples // 3
    chats = iter(conversations(num_samples - num_documents, with_images))
    samples = []
    for i in range(num_samples):
        if i % 3 == 2:          # num_samples // 3 of them
            ids = tokenizer(DOCUMENTS[(i // 3) % len(DOCUMENTS)], add_special_tokens=False)["input_ids"]
            samples.append(CalibrationSample(torch.tensor([ids[:max_tokens]])))
            continue
        text = tokenizer.apply_chat_template(next(chats), tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        has_image = with_images and image_token_id in ids
        if not has_image:
            samples.append(CalibrationSample(torch.tensor([ids[:max_tokens]])))
            continue
        from autoglm_serve.bench.screenshots import render_screenshot
        from autoglm_serve.multimodal.prompt import expand_image_tokens
        pixel_values, grid, _ = processor.batch([render_screenshot(0, i, 0)])
        # the text after the image is what gets cut: the image's tokens stay whole
        expanded = expand_image_tokens(ids, image_token_id, grid)
        start, n = expanded.image_ranges[0]
        expanded = expanded.token_ids[: max(max_tokens, start + n + 1)]
        input_ids = torch.tensor([expanded])
        samples.append(CalibrationSample(input_ids, pixel_values, grid,
                                         (input_ids == image_token_id).long()))
    return samples

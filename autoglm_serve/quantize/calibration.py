"""The built-in calibration set: short phone-agent and assistant conversations, rendered with the
model's own chat template; for a vision model each agent turn carries a synthetic screenshot.

Deterministic (a function of the sample count and the model's tokenizer) and bounded: at most
`max_tokens` text tokens a sample, screenshots downscaled to `max_pixels`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from autoglm_serve.bench.phone_agent import SYSTEM_PROMPT, TASKS, fallback_reply

# General assistant turns beside the agent ones, so that plain chat is calibrated too; answers
# of a few sentences of ordinary prose (short ones teach the statistics little).
CHAT_TURNS = [
    ("What is the capital of France?", "The capital of France is Paris. It lies on the Seine in the north of the country and has been the seat of government for most of the last thousand years."),
    ("Write a short poem about the sea.", "Waves fold into foam,\nsalt wind carries the voices of gulls,\nand the tide keeps its slow time against the stones of the harbour wall."),
    ("Explain what a GPU is.", "A GPU is a processor with thousands of small cores that run the same operation on many numbers at once. It was built to draw images, where every pixel needs similar work, and the same design makes it fast for training and running neural networks."),
    ("Which fruits are red?", "Strawberries, cherries, raspberries and many apples are red. Tomatoes are red as well, and botanists count them as fruit even though most people cook them as vegetables."),
    ("How do I turn on Wi-Fi on an Android phone?", "Swipe down from the top of the screen to open quick settings, then tap the Wi-Fi tile. You can also open Settings, choose Network and internet, and switch Wi-Fi on there; the phone then lists the networks it can see."),
    ("How do you say 'good morning' in Spanish?", "Good morning in Spanish is 'buenos dias'. In the afternoon people say 'buenas tardes', and in the evening 'buenas noches'."),
    ("What is 12 times 7?", "12 times 7 is 84. One way to check it is to compute 10 times 7, which is 70, and add 2 times 7, which is 14."),
    ("Give me a tip for writing clean code.", "Give functions and variables names that say what they hold, and keep each function doing one thing. Code is read far more often than it is written, so a reader who understands it quickly is worth more than a clever line."),
    ("Why is the sky blue?", "Sunlight contains every colour, but air molecules scatter short blue wavelengths much more strongly than long red ones. So when you look at any part of the sky away from the sun, you see the blue light that has been scattered towards you."),
    ("Tell me a fact about history.", "The Great Library of Alexandria was not destroyed in a single fire. It declined over several centuries as funding fell, scholars left, and the city passed through wars and changes of rule."),
    ("How can I sleep better?", "Go to bed and get up at the same time every day, even at weekends. Keep the bedroom dark and cool, avoid coffee in the afternoon, and put the phone away half an hour before you want to sleep."),
    ("Summarise what a bank does.", "A bank keeps money for its customers and lends part of it to others who need it, such as families buying a home or firms building a factory. It earns money from the difference between the interest it charges on loans and the interest it pays on savings."),
    ("What should I pack for a weekend hike?", "Take water, food for the whole day, a rain jacket, a warm layer, a map and a charged phone. Good shoes matter more than anything else, and it helps to tell someone where you are going and when you expect to be back."),
    ("Describe a cat in two sentences.", "A cat is a small, quiet hunter that spends most of the day asleep in the warmest place it can find. When it wakes it stretches, washes itself with great care, and then decides whether you deserve its attention."),
    ("What causes rain?", "Warm air rises and cools, and the water vapour it carries condenses into tiny droplets that form clouds. When the droplets join into drops too heavy for the air to hold up, they fall as rain."),
    ("Recommend a way to learn a language.", "Practise a little every day rather than a lot once a week. Listen to people speaking it, read simple stories, and try to talk as early as possible, because mistakes made aloud are the ones you remember."),
]


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
    """Alternating agent steps and chat turns; an agent step's user turn holds one image part."""
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
            question, answer = CHAT_TURNS[(i // 2) % len(CHAT_TURNS)]
            out.append([{"role": "user", "content": question},
                        {"role": "assistant", "content": answer}])
    return out


def calibration_samples(tokenizer, num_samples: int = 32, max_tokens: int = 512,
                        image_dir=None, image_token_id: int | None = None,
                        max_pixels: int = 500_000) -> list[CalibrationSample]:
    """`image_dir` (the checkpoint's preprocessor config) and `image_token_id` turn screenshots
    on: a vision model is calibrated on the image tokens it will see."""
    with_images = image_token_id is not None
    processor = None
    if with_images:
        from autoglm_serve.multimodal.image_processor import Glm4vImageProcessor
        processor = Glm4vImageProcessor.from_pretrained(image_dir, max_pixels=max_pixels)
    samples = []
    for i, messages in enumerate(conversations(num_samples, with_images)):
        text = tokenizer.apply_chat_template(messages, tokenize=False)
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

"""Our GLM-4.1V image preprocessing against transformers' Glm4vImageProcessor (PIL backend)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from autoglm_serve.multimodal.image_processor import Glm4vImageProcessor, ImageProcessorConfig

DATA = Path(__file__).parent / "data"
CONFIG_DIR = Path(__file__).parents[1] / "autoglm_serve/models/configs/autoglm-phone-9b"


def _reference(min_pixels: int, max_pixels: int):
    from transformers import Glm4vImageProcessorPil

    ref = Glm4vImageProcessorPil.from_pretrained(CONFIG_DIR)
    ref.size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    return ref


def _random_image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    bands = len(mode)
    arr = rng.integers(0, 256, size=(height, width, bands), dtype=np.uint8)
    return Image.fromarray(arr.squeeze(-1) if bands == 1 else arr, mode=mode)


def _check_against_reference(image: Image.Image, **overrides):
    ours = Glm4vImageProcessor.from_pretrained(CONFIG_DIR, **overrides)
    ref = _reference(ours.config.min_pixels, ours.config.max_pixels)
    want = ref(images=[image], return_tensors="pt")
    got = ours(image)
    assert list(got.grid_thw) == want["image_grid_thw"][0].tolist()
    assert got.num_tokens == int(want["image_grid_thw"][0].prod()) // 4
    assert got.pixel_values.dtype == torch.float32
    assert got.pixel_values.shape == want["pixel_values"].shape
    torch.testing.assert_close(got.pixel_values, want["pixel_values"].float(), atol=1e-5, rtol=0)
    assert ours.num_image_tokens(image.height, image.width) == got.num_tokens
    return got


def test_defaults_come_from_preprocessor_config():
    cfg = ImageProcessorConfig.from_pretrained(CONFIG_DIR)
    raw = json.loads((CONFIG_DIR / "preprocessor_config.json").read_text())
    assert cfg.min_pixels == raw["size"]["shortest_edge"]
    assert cfg.max_pixels == raw["size"]["longest_edge"]
    assert cfg.image_mean == tuple(raw["image_mean"])
    assert ImageProcessorConfig.from_pretrained(CONFIG_DIR, max_pixels=5_000_000).max_pixels == 5_000_000
    with pytest.raises(ValueError):
        ImageProcessorConfig.from_pretrained(CONFIG_DIR, not_an_option=1)
    with pytest.raises(ValueError, match="bicubic"):
        ImageProcessorConfig.from_pretrained(CONFIG_DIR, resample=Image.Resampling.BILINEAR)


def test_phone_screenshot_max_pixels_5m_gives_3108_tokens():
    image = Image.open(DATA / "phone_screenshot_1080x2400.png")
    assert image.size == (1080, 2400)
    got = _check_against_reference(image, max_pixels=5_000_000)
    assert got.grid_thw == (1, 168, 74)
    assert got.pixel_values.shape[0] == 12_432
    assert got.num_tokens == 3_108


def test_phone_screenshot_checkpoint_default():
    image = Image.open(DATA / "phone_screenshot_1080x2400.png")
    _check_against_reference(image)


@pytest.mark.parametrize("size", [(720, 1600), (1080, 2400)])
def test_phone_sizes(size):
    image = _random_image(*size, seed=size[0])
    _check_against_reference(image)
    _check_against_reference(image, max_pixels=1_000_000)


@pytest.mark.parametrize("size", [(30, 30), (3, 200), (200, 3), (1, 1), (13, 57), (333, 777), (1001, 99)])
def test_small_and_odd_sizes(size):
    _check_against_reference(_random_image(*size, seed=sum(size)))


def test_min_pixels_override_and_modes():
    _check_against_reference(_random_image(50, 70), min_pixels=200_000)
    _check_against_reference(_random_image(100, 60, mode="RGBA", seed=3))
    _check_against_reference(_random_image(100, 60, mode="L", seed=4))


def test_extreme_aspect_ratio_is_refused():
    with pytest.raises(ValueError):
        Glm4vImageProcessor()(_random_image(1, 300))


def test_batch_concatenates():
    ours = Glm4vImageProcessor.from_pretrained(CONFIG_DIR)
    a, b = _random_image(100, 200), _random_image(300, 90, seed=1)
    pixel_values, grid, tokens = ours.batch([a, b])
    assert grid.tolist() == [list(ours(a).grid_thw), list(ours(b).grid_thw)]
    assert pixel_values.shape[0] == int(grid.prod(-1).sum())
    assert tokens == [ours(a).num_tokens, ours(b).num_tokens]


def _phone_prompt_item():
    from types import SimpleNamespace

    from autoglm_serve.multimodal.processor import MultiModalProcessor

    image = Image.open(DATA / "phone_screenshot_1080x2400.png")
    hf_config = SimpleNamespace(image_token_id=7, image_start_token_id=6, image_end_token_id=8,
                                vision_config=SimpleNamespace(spatial_merge_size=2))
    processor = MultiModalProcessor(hf_config, CONFIG_DIR, {"max_pixels": 5_000_000})
    prompt = processor.build([1, 7, 2], [image])
    return image, processor.image_processor, prompt.items[0]


def test_front_end_ships_the_image_at_its_size_and_the_core_lays_it_out_as_pil_would():
    """build() hands the core the RGB screenshot unresized; patches() resizes and lays it out
    to exactly the patches of PIL's resize (which the front-end ran before)."""
    from autoglm_serve.multimodal.media import image_content_hash

    image, image_processor, item = _phone_prompt_item()
    rgb = np.array(image.convert("RGB"))
    assert item.pixel_values.dtype == torch.uint8
    assert torch.equal(item.pixel_values, torch.from_numpy(rgb))
    assert item.grid_thw == (1, 168, 74) and (item.offset, item.length) == (1, 3108)
    assert item.content_hash == image_content_hash(image)

    patches = item.patches(torch.device("cpu"))
    pil = Image.fromarray(rgb).resize((1036, 2352), resample=Image.Resampling.BICUBIC)
    want = image_processor.patches(torch.from_numpy(np.array(pil)))
    assert torch.equal(patches, want.pixel_values)
    assert item.pixel_values.dtype == torch.uint8       # the request keeps only its RGB image


@pytest.mark.gpu
def test_lay_out_on_the_gpu_equals_the_cpu():
    _, _, on_cpu = _phone_prompt_item()
    _, _, on_gpu = _phone_prompt_item()
    on_gpu = on_gpu.patches(torch.device("cuda"))
    assert on_gpu.is_cuda
    torch.testing.assert_close(on_gpu.cpu(), on_cpu.patches(torch.device("cpu")), rtol=0,
                               atol=1e-6)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from glm4v_fixtures import make_tiny_glm4v

    return make_tiny_glm4v(tmp_path_factory.mktemp("tiny"))


def test_prompt_expansion_matches_transformers_processor(tiny_dir):
    """Chat template -> ids -> our id-level expansion equals transformers' text-level expansion
    (Glm4vProcessor.replace_image_token; the full processor needs torchvision for its video half)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer, Glm4vImageProcessorPil, Glm4vProcessor

    from autoglm_serve.multimodal.prompt import expand_image_tokens
    from glm4v_fixtures import SPECIAL_IDS

    path = tiny_dir
    tokenizer = AutoTokenizer.from_pretrained(path)
    messages = [
        {"role": "system", "content": "You are a phone agent."},
        {"role": "user", "content": [
            {"type": "image"},   # the server's form of an image_url part
            {"type": "text", "text": "Tap the blue button, then"},
            {"type": "image", "image": "data:..."},
            {"type": "text", "text": "compare."},
        ]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("[gMASK]<sop><|system|>\nYou are a phone agent.<|user|>\n<|begin_of_image|><|image|><|end_of_image|>")
    assert text.endswith("<|assistant|>\n")
    images = [_random_image(300, 500), Image.open(DATA / "phone_screenshot_1080x2400.png")]

    ref_images = Glm4vImageProcessorPil.from_pretrained(path)
    ref_images.size = {"shortest_edge": 12544, "longest_edge": 1_000_000}
    feats = ref_images(images=images, return_tensors="pt")
    fake_processor = SimpleNamespace(image_processor=ref_images, image_token="<|image|>")
    pieces = text.split("<|image|>")
    expanded_text = pieces[0]
    for k, rest in enumerate(pieces[1:]):
        expanded_text += Glm4vProcessor.replace_image_token(fake_processor, feats, k) + rest
    want = tokenizer(expanded_text, add_special_tokens=False)["input_ids"]

    ours = Glm4vImageProcessor.from_pretrained(path, max_pixels=1_000_000)
    _, grid, counts = ours.batch(images)
    assert torch.equal(grid, feats["image_grid_thw"])
    got = expand_image_tokens(tokenizer(text, add_special_tokens=False)["input_ids"],
                              SPECIAL_IDS["<|image|>"], grid)
    assert got.token_ids == want
    assert [n for _, n in got.image_ranges] == counts
    for start, n in got.image_ranges:
        assert got.token_ids[start - 1] == SPECIAL_IDS["<|begin_of_image|>"]
        assert got.token_ids[start + n] == SPECIAL_IDS["<|end_of_image|>"]
    with pytest.raises(ValueError):
        expand_image_tokens(got.token_ids[:5] + [SPECIAL_IDS["<|image|>"]], SPECIAL_IDS["<|image|>"], grid)


def test_chat_template_replays_history_as_published(tiny_dir):
    """GLM-4.1V's template replays an assistant turn as given (thinking included), has no
    enable_thinking switch and leaves tool turns out."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>secret plan</think><answer>hello</answer>"},
        {"role": "tool", "content": "ignored"},
        {"role": "user", "content": "again"},
    ]
    on = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    off = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                        enable_thinking=False)
    assert on == ("[gMASK]<sop><|user|>\nhi<|assistant|>\n<think>secret plan</think>"
                  "<answer>hello</answer><|user|>\nagain<|assistant|>\n")
    assert off == on

"""Our GLM-4.1V vision tower against transformers' Glm4vVisionModel on the same tiny random weights."""
from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

from autoglm_serve.models.glm4v_vision import Glm4vVisionTower
from glm4v_fixtures import make_tiny_glm4v, tiny_glm4v_config


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    from transformers import Glm4vForConditionalGeneration

    path = make_tiny_glm4v(tmp_path_factory.mktemp("tiny_glm4v"))
    reference = Glm4vForConditionalGeneration.from_pretrained(path, torch_dtype=torch.float32,
                                                              attn_implementation="sdpa").eval()
    ours = Glm4vVisionTower(reference.config.vision_config).eval()
    state = load_file(str(path / "model.safetensors"))
    loaded = ours.load_weights(state.items())
    assert loaded == {name for name, _ in ours.named_parameters()}, "every parameter comes from the checkpoint"
    return ours, reference.model.visual


def _pixels(grid: list[list[int]], seed: int = 0) -> torch.Tensor:
    patches = sum(t * h * w for t, h, w in grid)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(patches, 3 * 2 * 14 * 14, generator=g)


def _compare(towers, grid):
    ours, reference = towers
    pixel_values = _pixels(grid)
    grid_thw = torch.tensor(grid)
    with torch.no_grad():
        want = reference(pixel_values, grid_thw=grid_thw).pooler_output
        got = ours(pixel_values, grid_thw)
    m2 = 4
    assert got.shape == (sum(t * h * w for t, h, w in grid) // m2, ours.out_hidden)
    err = (got - want).norm() / want.norm()
    assert err < 1e-4, f"relative error {err:.2e}"
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    return got


def test_one_image(towers):
    _compare(towers, [[1, 8, 12]])


def test_two_images_of_different_sizes_stay_separate(towers):
    grid = [[1, 6, 10], [1, 14, 4]]
    both = _compare(towers, grid)
    # attention never crosses images: each image alone gives the same rows
    ours, _ = towers
    pixels = _pixels(grid)
    n0 = 6 * 10
    with torch.no_grad():
        first = ours(pixels[:n0], [[1, 6, 10]])
        second = ours(pixels[n0:], [[1, 14, 4]])
    torch.testing.assert_close(both, torch.cat([first, second]), rtol=1e-5, atol=1e-5)


def test_geometry_of_a_repeated_grid_is_kept_and_renewed_with_the_weights(towers):
    """A phone agent's screenshots share one grid: the second call reuses the first's position
    embeddings and rotary angles (and still matches transformers); a new position table
    loaded into the tower is not hidden by the kept ones."""
    first = _compare(towers, [[1, 8, 12]])
    again = _compare(towers, [[1, 8, 12]])
    assert torch.equal(first, again)
    _compare(towers, [[1, 6, 10]])          # another grid in between
    assert torch.equal(_compare(towers, [[1, 8, 12]]), first)

    ours, _ = towers
    tower = copy.deepcopy(ours)
    pixels = _pixels([[1, 8, 12]])
    with torch.no_grad():
        kept = tower(pixels, [[1, 8, 12]])
        table = torch.randn_like(tower.pos_embed)
        tower.load_weights([("model.visual.embeddings.position_embedding.weight", table)])
        renewed = tower(pixels, [[1, 8, 12]])
        fresh = copy.deepcopy(tower)
        fresh._last_geometry = None
        torch.testing.assert_close(renewed, fresh(pixels, [[1, 8, 12]]), rtol=0, atol=0)
    assert not torch.allclose(renewed, kept)


def test_grid_larger_than_position_table(towers):
    # the 24x24 learned table is upsampled here (phone screenshots are ~170 patches tall)
    _compare(towers, [[1, 30, 6]])


def test_real_image_through_processor(towers):
    from PIL import Image
    from autoglm_serve.multimodal.image_processor import Glm4vImageProcessor

    processor = Glm4vImageProcessor.from_pretrained(None, max_pixels=200_000)
    image = Image.open(__import__("pathlib").Path(__file__).parent / "data/phone_screenshot_1080x2400.png")
    item = processor(image)
    ours, reference = towers
    with torch.no_grad():
        want = reference(item.pixel_values, grid_thw=torch.tensor([item.grid_thw])).pooler_output
        got = ours(item.pixel_values, [item.grid_thw])
    assert got.shape[0] == item.num_tokens
    assert ((got - want).norm() / want.norm()) < 1e-4


def test_bad_inputs_are_refused(towers):
    ours, _ = towers
    with pytest.raises(ValueError):
        ours(_pixels([[1, 4, 4]]), [[1, 4, 6]])
    with pytest.raises(KeyError):
        ours.load_weights([("model.visual.not_a_weight", torch.zeros(1))])
    # language-model names are skipped, not errors
    assert ours.load_weights([("model.language_model.norm.weight", torch.zeros(1))]) == set()


def test_bfloat16_runs_close(towers):
    ours, _ = towers
    import copy

    bf = copy.deepcopy(ours).to(torch.bfloat16)
    grid = [[1, 8, 8]]
    with torch.no_grad():
        ref = ours(_pixels(grid), grid)
        got = bf(_pixels(grid), grid).float()
    assert got.dtype == torch.float32 and ((got - ref).norm() / ref.norm()) < 5e-2


def test_config_sizes_match_checkpoint_layout():
    cfg = tiny_glm4v_config().vision_config
    tower = Glm4vVisionTower(cfg)
    assert tower.blocks[0].mlp.gate_up.weight.shape == (2 * cfg.out_hidden_size, cfg.hidden_size)
    assert tower.merger.mlp.gate_up.weight.shape == (2 * cfg.intermediate_size, cfg.out_hidden_size)


def test_real_autoglm_sizes_load_every_checkpoint_tensor():
    """At AutoGLM-Phone-9B's real sizes (on the meta device: shapes only), every ``model.visual.*``
    tensor of transformers' layout maps onto exactly our parameters with matching shapes."""
    from pathlib import Path

    from transformers import AutoConfig
    from transformers.models.glm4v.modeling_glm4v import Glm4vVisionModel

    cfg = AutoConfig.from_pretrained(Path(__file__).parents[1] / "autoglm_serve/models/configs/autoglm-phone-9b")
    with torch.device("meta"):
        reference = Glm4vVisionModel._from_config(cfg.vision_config)
        ours = Glm4vVisionTower(cfg.vision_config)
    names = [("model.visual." + k, v) for k, v in reference.state_dict().items()]
    assert ours.load_weights(names) == {n for n, _ in ours.named_parameters()}
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())

"""M-RoPE against transformers' GLM-4.1V: the positions (get_rope_index) and the model's rotary
(MRotaryEmbedding against Glm4vTextRotaryEmbedding and apply_rotary_pos_emb)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoglm_serve.models.glm4v import MRotaryEmbedding, glm4v_rotary
from autoglm_serve.models.mrope import get_mrope_positions
from glm4v_fixtures import SPECIAL_IDS, tiny_glm4v_config

CONFIG_DIR = Path(__file__).parents[1] / "autoglm_serve/models/configs/autoglm-phone-9b"
IMG = SPECIAL_IDS["<|image|>"]
BOI, EOI = SPECIAL_IDS["<|begin_of_image|>"], SPECIAL_IDS["<|end_of_image|>"]


@pytest.fixture(scope="module")
def reference_model():
    from transformers import Glm4vModel

    return Glm4vModel(tiny_glm4v_config()).eval()


def _prompt(pieces: list) -> list[int]:
    """ints are text tokens; a (t, h, w) tuple is one image with its begin/end markers."""
    ids: list[int] = []
    for piece in pieces:
        if isinstance(piece, tuple):
            t, h, w = piece
            ids += [BOI] + [IMG] * (t * h * w // 4) + [EOI]
        else:
            ids += [i % 200 + 1 for i in range(piece)]
    return ids


def _reference(model, ids: list[int], grids: list[tuple[int, int, int]]):
    input_ids = torch.tensor([ids])
    mm_types = (input_ids == IMG).int()
    positions, delta = model.get_rope_index(
        input_ids, mm_types, image_grid_thw=torch.tensor(grids) if grids else None
    )
    return positions[:, 0], int(delta[0, 0])


@pytest.mark.parametrize("pieces", [
    [17],
    [5, (1, 8, 12), 9],
    [3, (1, 6, 10), 4, (1, 14, 4), 6],
    [(1, 2, 2)],
    [2, (1, 28, 6), (1, 4, 4)],
])
def test_positions_match_get_rope_index(reference_model, pieces):
    ids = _prompt(pieces)
    grids = [p for p in pieces if isinstance(p, tuple)]
    got, delta = get_mrope_positions(ids, IMG, grids, spatial_merge_size=2)
    want, want_delta = _reference(reference_model, ids, grids)
    assert got.dtype == torch.long and got.shape == (3, len(ids))
    assert torch.equal(got, want)
    assert delta == want_delta
    if not grids:
        assert delta == 0


def test_decode_positions_continue_with_delta(reference_model):
    """Generated token n sits at n + delta in every row: the prompt plus k more text tokens agrees."""
    ids = _prompt([4, (1, 10, 6), 3])
    positions, delta = get_mrope_positions(ids, IMG, [(1, 10, 6)])
    longer, _ = get_mrope_positions(ids + [7, 8, 9], IMG, [(1, 10, 6)])
    for n in range(len(ids), len(ids) + 3):
        assert longer[:, n].tolist() == [n + delta] * 3


def test_mismatched_images_are_refused():
    ids = _prompt([2, (1, 4, 4), 2])
    with pytest.raises(ValueError):
        get_mrope_positions(ids, IMG, [])
    with pytest.raises(ValueError):
        get_mrope_positions(ids, IMG, [(1, 4, 4), (1, 4, 4)])
    with pytest.raises(ValueError):
        get_mrope_positions(ids, IMG, [(1, 4, 6)])


def test_cos_sin_match_text_rotary_embedding_real_config():
    from transformers import AutoConfig
    from transformers.models.glm4v.modeling_glm4v import Glm4vTextRotaryEmbedding

    text = AutoConfig.from_pretrained(CONFIG_DIR).text_config
    reference = Glm4vTextRotaryEmbedding(text)
    ids = _prompt([5, (1, 40, 18), 7, (1, 6, 10), 2])
    positions, _ = get_mrope_positions(ids, IMG, [(1, 40, 18), (1, 6, 10)])
    positions = positions + 3000        # later in a conversation: angles large enough to matter
    x = torch.zeros(1, positions.shape[1], 8, dtype=torch.float32)
    want_cos, want_sin = reference(x, positions[:, None, :])
    rotary = glm4v_rotary(text)       # the model's own, built as Glm4vForConditionalGeneration does
    cos, sin = rotary.cos_sin(positions)
    assert cos.shape == (positions.shape[1], 32)     # one angle per interleaved pair
    # transformers repeats each pair's angle for both of its channels. The same float32 angles,
    # but not torch.equal: one run in a few hundred differed in the last bit of a cos.
    exact = dict(rtol=0, atol=1e-6)
    torch.testing.assert_close(cos.repeat_interleave(2, -1), want_cos[0], **exact)
    torch.testing.assert_close(sin.repeat_interleave(2, -1), want_sin[0], **exact)

    # text-only positions given as [T] equal the same positions broadcast to 3 rows
    flat = torch.arange(50)
    c1, s1 = rotary.cos_sin(flat)
    c3, s3 = rotary.cos_sin(flat.expand(3, -1))
    assert torch.equal(c1, c3) and torch.equal(s1, s3)


def test_rotation_matches_apply_rotary_pos_emb():
    from transformers.models.glm4v.modeling_glm4v import apply_rotary_pos_emb

    torch.manual_seed(0)
    T, H, D = 11, 4, 128
    rotary = MRotaryEmbedding(D, D // 2, 512, 10000.0, [8, 12, 12])
    positions = torch.randint(0, 500, (3, T))
    cos, sin = rotary.cos_sin(positions)
    q, k = torch.randn(T, H, D), torch.randn(T, 2, D)
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                          cos.repeat_interleave(2, -1)[None],
                                          sin.repeat_interleave(2, -1)[None])
    got_q, got_k = rotary.apply(q.reshape(T, -1), k.reshape(T, -1), cos, sin)
    torch.testing.assert_close(got_q.view(T, H, D), want_q[0].transpose(0, 1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_k.view(T, 2, D), want_k[0].transpose(0, 1), rtol=1e-6, atol=1e-6)

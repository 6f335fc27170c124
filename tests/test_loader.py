"""Safetensors loading against transformers' own save_pretrained of a tiny random Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from autoglm_serve.loader import iter_safetensors_weights, safetensors_files


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(torch.bfloat16)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return _tiny_llama()


@pytest.fixture
def single_dir(tmp_path: Path, model: LlamaForCausalLM) -> Path:
    model.save_pretrained(tmp_path / "single")
    return tmp_path / "single"


@pytest.fixture
def sharded_dir(tmp_path: Path, model: LlamaForCausalLM) -> Path:
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    return tmp_path / "sharded"


def _assert_same_as_state_dict(weights: dict[str, torch.Tensor], model: LlamaForCausalLM) -> None:
    expected = model.state_dict()
    assert set(weights) == set(expected)
    for name, tensor in weights.items():
        assert tensor.dtype == expected[name].dtype, name
        assert torch.equal(tensor, expected[name]), name


def test_single_file_round_trip(single_dir: Path, model: LlamaForCausalLM) -> None:
    assert [p.name for p in safetensors_files(single_dir)] == ["model.safetensors"]
    _assert_same_as_state_dict(dict(iter_safetensors_weights(single_dir)), model)


def test_sharded_round_trip(sharded_dir: Path, model: LlamaForCausalLM) -> None:
    shards = safetensors_files(sharded_dir)
    assert len(shards) > 2, "max_shard_size should have forced several shards"
    assert len(set(shards)) == len(shards)
    names = [name for name, _ in iter_safetensors_weights(sharded_dir)]
    assert len(names) == len(set(names)), "each shard must be read once"
    _assert_same_as_state_dict(dict(iter_safetensors_weights(sharded_dir)), model)


def test_iteration_is_lazy(sharded_dir: Path) -> None:
    # Deleting a later shard after the first tensor came out must not matter until we reach it.
    shards = safetensors_files(sharded_dir)
    weights = iter_safetensors_weights(sharded_dir)
    next(weights)
    shards[-1].write_bytes(b"garbage")
    with pytest.raises(ValueError, match=shards[-1].name):
        list(weights)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(iter_safetensors_weights(tmp_path / "nope"))


def test_directory_without_checkpoint_lists_contents(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"model.safetensors.*pytorch_model\.bin"):
        list(iter_safetensors_weights(tmp_path))


def test_truncated_file(single_dir: Path) -> None:
    path = single_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors.*(corrupt|truncated|cannot read)"):
        list(iter_safetensors_weights(single_dir))


def test_garbage_file(single_dir: Path) -> None:
    (single_dir / "model.safetensors").write_bytes(b"\x00not a safetensors file at all" * 10)
    with pytest.raises(ValueError, match=r"model\.safetensors: corrupt or truncated"):
        list(iter_safetensors_weights(single_dir))


def test_index_names_missing_tensor(sharded_dir: Path) -> None:
    index_path = sharded_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first_shard = next(iter(index["weight_map"].values()))
    index["weight_map"]["model.layers.9.ghost.weight"] = first_shard
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"model\.layers\.9\.ghost\.weight"):
        list(iter_safetensors_weights(sharded_dir))


def test_index_names_missing_shard(sharded_dir: Path) -> None:
    shard = safetensors_files(sharded_dir)[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        list(iter_safetensors_weights(sharded_dir))


def test_invalid_index(sharded_dir: Path) -> None:
    (sharded_dir / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid safetensors index"):
        list(iter_safetensors_weights(sharded_dir))

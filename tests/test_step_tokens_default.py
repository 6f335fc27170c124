"""max_num_batched_tokens when none is given: vLLM's defaults by usage and device
(engine/settings.py). A server keeps 2,048 everywhere; the offline API takes larger steps on a
GPU, where each prompt step's launches cost the host a fixed time."""
import pytest
import torch

from autoglm_serve import LLM
from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.settings import offline_gpu_step_tokens, resolve_settings
from glm4v_fixtures import make_tiny_glm4v


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_glm4v(tmp_path_factory.mktemp("tiny") / "glm4v"))


@pytest.mark.parametrize("offline", [False, True])
def test_cpu_steps_stay_at_2048(tiny, offline):
    settings = resolve_settings(EngineConfig(model=tiny, device="cpu"), offline=offline)
    assert settings.max_num_batched_tokens == 2048


def test_more_sequences_than_the_default_raise_it(tiny):
    settings = resolve_settings(EngineConfig(model=tiny, device="cpu", max_num_seqs=3000))
    assert settings.max_num_batched_tokens == 3000


def test_a_given_budget_wins_offline(tiny):
    settings = resolve_settings(EngineConfig(model=tiny, device="cpu",
                                             max_num_batched_tokens=512), offline=True)
    assert settings.max_num_batched_tokens == 512


@pytest.mark.parametrize("gib, name, tokens", [
    (140, "NVIDIA H200", 16384), (79, "NVIDIA H100 80GB HBM3", 16384),
    (80, "NVIDIA A100-SXM4-80GB", 8192), (24, "NVIDIA GeForce RTX 4090", 8192),
    (48, "NVIDIA L40S", 8192)])
def test_offline_gpu_steps_by_card(gib, name, tokens):
    assert offline_gpu_step_tokens(gib * 2**30, name) == tokens


@pytest.mark.gpu
def test_offline_engine_on_this_gpu(tiny):
    props = torch.cuda.get_device_properties(0)
    llm = LLM(tiny, device="cuda", kv_cache_memory_gib=0.5, max_model_len=1024)
    assert llm.engine.core.max_num_batched_tokens == offline_gpu_step_tokens(
        props.total_memory, props.name)

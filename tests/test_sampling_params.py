import pytest

from autoglm_serve.sampling_params import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.seed is None and p.max_tokens == 16 and p.min_tokens == 0
    assert p.stop == [] and p.stop_token_ids == []
    assert p.logprobs is None and not p.ignore_eos
    assert p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.include_stop_str_in_output
    assert not p.greedy


def test_stop_normalized_to_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop_token_ids=(5, 7)).stop_token_ids == [5, 7]


@pytest.mark.parametrize("kwargs,greedy", [
    (dict(temperature=0.0), True),
    (dict(temperature=1e-6), True),
    (dict(temperature=0.7, top_k=1), True),
    (dict(temperature=0.7), False),
    (dict(temperature=0.7, top_k=2), False),
    (dict(temperature=0.7, top_k=-1), False),
])
def test_greedy_property(kwargs, greedy):
    assert SamplingParams(**kwargs).greedy is greedy


def test_valid_edges_accepted():
    SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, min_p=1.0, frequency_penalty=-2.0,
                   presence_penalty=2.0, repetition_penalty=0.01, max_tokens=1, min_tokens=1,
                   logprobs=20, seed=0)
    SamplingParams(max_tokens=None, min_tokens=10_000)  # no upper bound to check against
    SamplingParams(logprobs=0, top_p=1e-9, min_p=0.0)


@pytest.mark.parametrize("field,value", [
    ("n", 0), ("n", 1.5), ("n", True),
    ("temperature", -0.1), ("temperature", float("nan")),
    ("top_p", 0.0), ("top_p", 1.01), ("top_p", -0.5),
    ("top_k", -2), ("top_k", 2.5),
    ("min_p", -0.01), ("min_p", 1.5),
    ("frequency_penalty", 2.01), ("frequency_penalty", -2.5),
    ("presence_penalty", 2.5), ("presence_penalty", -2.01),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("max_tokens", 0), ("max_tokens", -3),
    ("min_tokens", -1),
    ("logprobs", -1), ("logprobs", 21),
    ("seed", 1.5), ("seed", "42"), ("seed", True),
])
def test_invalid_field_raises_naming_it(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_raises():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    assert SamplingParams(max_tokens=5, min_tokens=5).min_tokens == 5


@pytest.mark.parametrize("stop", ["", ["ok", ""], [3]])
def test_bad_stop_strings_raise(stop):
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=stop)


def test_bad_stop_token_ids_raise():
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[1, -2])


def test_clone_is_deep_and_independent():
    p = SamplingParams(n=3, seed=1, stop=["x"], stop_token_ids=[9])
    c = p.clone()
    assert c == p and c is not p
    c.stop.append("y")
    c.stop_token_ids.append(10)
    c.seed = 2
    assert p.stop == ["x"] and p.stop_token_ids == [9] and p.seed == 1

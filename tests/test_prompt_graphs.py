"""The padded sizes of the prompt steps' piecewise CUDA graphs (engine/core/prompt_graphs.py;
the graphs themselves are GPU tests in test_gpu_engine.py)."""
import pytest

from autoglm_serve.engine.core.cuda_graphs import padded_size
from autoglm_serve.engine.core.prompt_graphs import MAX_TOKENS, capture_sizes


@pytest.mark.parametrize("max_tokens", [8, 128, 300, 2048, 8192])
def test_every_step_pads_by_at_most_127_rows(max_tokens):
    sizes = capture_sizes(max_tokens)
    assert sizes == sorted(set(sizes)) and sizes[-1] == min(max_tokens, MAX_TOKENS)
    for tokens in range(1, sizes[-1] + 1):
        padded = next(s for s in sizes if s >= tokens)
        assert padded_size(sizes, tokens) == padded   # the size a step of this many replays
        assert padded - tokens <= 127, (tokens, padded)
    assert padded_size(sizes, sizes[-1] + 1) is None     # larger steps run eagerly

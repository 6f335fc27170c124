"""The start-up sweep of the linear layers (engine/core/linear_warm_up.py): every distinct
linear of the decoder at every row count up to the step budget, the LM head at every count of
sampled rows, and not the vision tower, whose row counts are images' patch counts."""
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from autoglm_serve import LLM
from autoglm_serve.engine.core.linear_warm_up import SWEPT_ROWS, warm_up_linears
from autoglm_serve.engine.settings import default_step_tokens
from tests.glm4v_fixtures import make_tiny_glm4v


def test_every_decoder_linear_runs_at_every_row_count_and_the_tower_at_none(tmp_path):
    torch.set_num_threads(1)
    llm = LLM(str(make_tiny_glm4v(tmp_path / "glm4v")), dtype="bfloat16", max_model_len=512,
              kv_cache_memory_gib=0.05)
    model = llm.engine.core.loaded.model
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        warm_up_linears(model, torch.bfloat16, max_rows=40, max_sampled_rows=6)
    rows_by_weight = collections.defaultdict(set)
    for event in prof.events():
        if event.name == "aten::linear":
            x, weight = event.input_shapes[:2]
            rows_by_weight[tuple(weight)].add(x[0])
    decoder = {tuple(p.shape) for name, p in model.language_model.named_parameters()
               if name.endswith("proj.weight")}
    tower = {tuple(p.shape) for p in model.visual.parameters() if p.dim() == 2}
    head = tuple(model.language_model.lm_head.weight.shape)
    assert decoder and decoder <= rows_by_weight.keys()
    for shape in decoder - {head}:
        assert rows_by_weight[shape] == set(range(1, 41)), shape
    assert rows_by_weight[head] == set(range(1, 7))
    tower_only = tower - decoder - {head}
    assert tower_only and not tower_only & rows_by_weight.keys()
    # a server's default budget, swept whole
    assert SWEPT_ROWS >= default_step_tokens(llm.engine.core.config, offline=False)

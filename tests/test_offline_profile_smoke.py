"""scripts/gpu/offline_profile.py --smoke runs the GPU script's whole path on CPU (a tiny
GLM-4.1V, two step budgets on one engine): the core's record of every step must account for
every token the batch computed, and a smaller budget must split the prompts into more steps."""
import json

from gpu_script_smoke import run_smoke


def test_offline_profile_smoke_runs():
    out = run_smoke("offline_profile.py")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    runs = {x["budget"]: x for x in lines if x["kind"] == "run"}
    assert sorted(runs) == [64, 256]
    for run in runs.values():
        # 8 prompts of 48 tokens, 24 tokens out each: the last sampled token is never fed back
        assert run["prompt_steps"]["tokens"] + run["decode_steps"]["tokens"] == 8 * (48 + 23)
        # each step's prompt chunks counted as it ran (read after the batch, a chunk of fewer
        # tokens than the request later decoded would pass for a decode row)
        assert run["prompt_steps"]["prompt_tokens"] == 8 * 48
        assert run["decode_steps"]["prompt_tokens"] == 0
        assert run["out_tok_s"] > 0 and run["prompt_steps"]["launch_ms"] > 0
    assert runs[64]["prompt_steps"]["steps"] > runs[256]["prompt_steps"]["steps"]
    assert {x["budget"] for x in lines if x["kind"] == "profile"} == {64, 256}

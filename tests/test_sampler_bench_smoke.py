"""scripts/gpu/sampler_bench.py --smoke runs the GPU script's whole path on CPU (small rows and
vocabulary), so the device call does not fail on a typo, and every sampling it times gives the
same tokens in groups of 1, 2 and 4 rows, from bf16 logits and float32 ones of the same values."""
import json

from gpu_script_smoke import run_smoke


def test_sampler_bench_smoke_runs():
    out = run_smoke("sampler_bench.py")
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert {(r["rows"], r["sampling"], r["logits"], r["group_rows"]) for r in rows} == {
        (n, s, d, g) for n in (4, 8) for s in ("open-autoglm", "chat", "worst")
        for d in ("bfloat16", "float32") for g in (4, 2, 1)}
    for row in rows:
        assert row["ms"] > 0 and row["same_tokens"], row

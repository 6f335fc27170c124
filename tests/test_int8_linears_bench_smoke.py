"""scripts/gpu/int8_linears_bench.py --smoke --sweep runs every part of the GPU script on CPU
(Triton interpreter, tiny shapes), so a GPU call does not fail on a typo."""
import re

from gpu_script_smoke import run_smoke


def test_int8_linears_bench_smoke_runs():
    stdout = run_smoke("int8_linears_bench.py", "--sweep", timeout=600)
    rows = [line for line in stdout.splitlines() if re.match(r"\| (down|gate_up) \|", line)]
    assert len(rows) == 16, stdout
    for row in rows:       # the engine's 8-bit path agrees with dequantize-then-matmul
        assert float(row.rstrip(" |").rsplit("|", 1)[1]) < 1e-2, row
    entries = re.findall(r"\('(linear|gated)', (\d+), (\d+), (\d+), 128\): GemvConfig\(", stdout)
    assert {(kind, int(m)) for kind, m, _, _ in entries} == {
        (kind, m) for kind in ("linear", "gated") for m in (1, 4, 16, 32)}

"""scripts/gpu/prefill_tiles_sweep.py --smoke runs the GPU script's whole path on CPU (Triton
interpreter, tiny chunks), so the device call does not fail on a typo: with pages of 16 the
kernel gathers K/V by token, with pages of 64 it loads TMA boxes, and every tile it times agrees
with the launcher's default tiles (a tile that disagrees is left out of the table)."""
import pytest

from gpu_script_smoke import run_smoke


@pytest.mark.parametrize("block_size,loads", [(16, "gathered by token"), (64, "TMA boxes")])
def test_prefill_tiles_sweep_smoke_runs(block_size, loads):
    out = run_smoke("prefill_tiles_sweep.py", "--block-size", str(block_size))
    assert f"pages of {block_size}: {loads}" in out
    table = [line for line in out.splitlines() if line.startswith("| (")]
    assert len(table) == 2, out[-2000:]
    assert sum("(current)" in line for line in table) == 1

"""scripts/gpu/ttft_offline.py --smoke runs every part of the GPU script on CPU (tiny GLM-4.1V,
small screenshots): both scheduler variants time their turns and are profiled."""

from gpu_script_smoke import run_smoke


def test_ttft_offline_smoke_runs():
    out = run_smoke("ttft_offline.py", "--min-chunk-before-image", "0,256")
    for v in (0, 256):
        assert f"min chunk before an image {v}: TTFT median" in out, out[-2000:]
        assert f"min chunk {v}, profiled: wall" in out

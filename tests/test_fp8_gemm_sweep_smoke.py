"""scripts/gpu/fp8_gemm_sweep.py --smoke runs every part of the GPU script on CPU (Triton
interpreter, tiny shapes, partial tiles), so the H200 run does not fail on a typo, and the
split-K GEMM agrees with _scaled_mm there."""
import json
import sys

from gpu_script_smoke import ROOT, run_smoke


def test_fp8_gemm_sweep_smoke_runs():
    out = run_smoke("fp8_gemm_sweep.py")
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert {(row["shape"], row["m"]) for row in rows} == {
        (s, m) for s in ("qkv", "gate_up", "down") for m in (3, 40, 70)}
    for row in rows:
        assert row["configs_wrong"] == [] and row["split_k_config"] is not None, row
        assert row["bf16_us"] > 0 and row["scaled_mm_us"] > 0, row
        # the FP8 GEMV's rows: its time and the quantization the GEMM would add
        assert (row["m"] == 3) == ("fp8_gemv_us" in row) == ("quantize_us" in row), row
        assert ("silu_quantize_us" in row) == (row["m"] == 3 and row["shape"] == "gate_up")
    assert "0 configs disagreed with _scaled_mm" in out
    # a TUNED entry per (rows bucket, shape) past the GEMV's rows
    assert out.count("(64, 96, 160): ") == 1 and out.count("(128, 64, 300): ") == 1
    assert "(16, 96, 160): " not in out
    # and a verdict for each of the GEMV's keys at 3 rows (bucket 4)
    for key in ("('linear', 4, 96, 160)", "('gated', 4, 64, 160)", "('linear', 4, 128, 160)",
                "('linear', 4, 64, 300)"):
        assert out.count(key + ": ") == 1, key


def test_tuned_table_shares_configs_within_three_percent():
    """Each shape gets a config near its best from as few distinct configs as cover them all,
    and None where the best does not beat _scaled_mm by 3%."""
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    from fp8_gemm_sweep import tuned_table

    def row(m, n, tried, scaled_mm):
        best = min(tried.values())
        return {"shape": f"s{n}", "m": m, "n": n, "k": 64, "scaled_mm_us": scaled_mm,
                "split_k_best_us": best, "tried": tried}
    a, b, c = "(16, 64, 128, 4, 4, 4)", "(32, 64, 256, 2, 4, 3)", "(64, 64, 256, 1, 4, 3)"
    rows = [row(16, 96, {a: 10.0, b: 10.2, c: 12.0}, 15.0),     # a best, b near
            row(32, 96, {a: 11.0, b: 10.0}, 15.0),              # b only
            row(64, 96, {c: 9.0, b: 9.2}, 13.0),                # c best, b near
            row(128, 96, {c: 13.2}, 13.5)]                      # not 3% faster
    lines = tuned_table(rows)
    assert lines[0].startswith("    (16, 96, 64): GemmConfig(32, 64, 256, 2, 4, 3),")
    assert lines[1].startswith("    (32, 96, 64): GemmConfig(32, 64, 256, 2, 4, 3),")
    assert lines[2].startswith("    (64, 96, 64): GemmConfig(32, 64, 256, 2, 4, 3),")
    assert lines[3].startswith("    (128, 96, 64): None,")


def test_gemv_decisions_count_what_the_gemm_path_runs_around_its_gemms():
    """One row: qkv's input is quantized on its own (the norm gives it the amax only); from two
    rows it comes quantized from the norm. The MLP goes one way for gate_up and its plain twin;
    down follows gate_up's GEMM path, or is weighed on its own after the gated GEMV."""
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    from fp8_gemm_sweep import gemv_decisions

    def row(shape, m, n, k, gemv, gemm, quantize, silu=None):
        r = {"shape": shape, "m": m, "n": n, "k": k, "fp8_gemv_us": gemv,
             "split_k_best_us": gemm, "scaled_mm_us": gemm + 5, "quantize_us": quantize}
        return r if silu is None else {**r, "silu_quantize_us": silu}
    rows = [row("qkv", 1, 4608, 4096, 11.0, 10.0, 2.0),         # 10 + 2 > 11: keep
            row("qkv", 2, 4608, 4096, 11.0, 10.0, 2.0),         # 10 < 11: GEMM
            row("gate_up", 2, 27392, 4096, 50.0, 40.0, 2.0, 6.0),
            row("down", 2, 4096, 13696, 40.0, 22.0, 7.0),       # 40 + 6 + 22 < 50 + 40
            row("gate_up", 1, 27392, 4096, 40.0, 40.0, 2.0, 6.0),
            row("down", 1, 4096, 13696, 22.0, 21.0, 3.0)]       # keep; down alone 3 + 21 > 22
    lines = "\n".join(gemv_decisions(rows))
    assert ("# ('linear', 1, 4608, 4096): keep the GEMV, GEMV 11.0; quantize 2.0 + GEMM 10.0"
            in lines)
    assert "    ('linear', 2, 4608, 4096): None,  # GEMV 11.0; quantize 0.0 + GEMM 10.0" in lines
    for key in ("('gated', 2, 13696, 4096)", "('linear', 2, 27392, 4096)",
                "('linear', 2, 4096, 13696)"):
        assert f"    {key}: None," in lines, key
    for key in ("('gated', 1, 13696, 4096)", "('linear', 1, 27392, 4096)",
                "('linear', 1, 4096, 13696)"):
        assert f"# {key}: keep the GEMV" in lines, key

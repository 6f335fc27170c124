"""The latency-throughput plot names an unlimited-concurrency run ∞, not its observed peak."""
from autoglm_serve.bench.plots import concurrency_label, plot_latency_throughput


def _point(limit, peak):
    stats = {"mean": 10.0, "p99": 20.0}
    return {"max_concurrency": limit,
            "summary": {"completed": 4, "max_concurrent_requests": peak, "output_throughput": 5.0,
                        "e2el_ms": stats, "ttft_ms": stats, "tpot_ms": stats}}


def test_unlimited_level_is_labelled_infinite(tmp_path):
    assert concurrency_label(_point(4, 4)) == "c=4"
    assert concurrency_label(_point(None, 4)) == "c=∞ (peak 4)"
    run = {"label": "x", "points": [_point(1, 1), _point(None, 4)]}
    png = plot_latency_throughput([run], tmp_path / "p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"

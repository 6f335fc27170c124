"""GPU monitor of autoglm_serve.bench: no-GPU behaviour, sampling thread, per-window stats, plot."""

from __future__ import annotations

import itertools
import time

import pytest

from autoglm_serve.bench.gpu_monitor import GpuMonitor, GpuSample, gpu_stats
from autoglm_serve.bench.plots import plot_gpu_timeline


def sample(t: float, util: float, mem_mib: float, device: int = 0) -> GpuSample:
    return GpuSample(time=t, device=device, util_pct=util, mem_util_pct=util / 2,
                     mem_used_mib=mem_mib, mem_total_mib=81920, power_w=300 + util,
                     sm_clock_mhz=1980, mem_clock_mhz=2619)


def test_no_gpu_is_a_note_not_an_error():
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here: this test is for machines without a GPU")
    except Exception:
        pass
    mon = GpuMonitor()
    assert not mon.available
    assert mon.note.startswith("no GPU monitoring")
    mon.start()  # harmless
    mon.stop()
    assert mon.samples == []
    assert mon.stats(0, 1e9).samples == 0


def test_sampling_thread_collects_at_the_interval():
    counter = itertools.count()
    mon = GpuMonitor(interval_s=0.02,
                     sampler=lambda: [sample(time.perf_counter(), next(counter) % 100, 1000.0)])
    assert mon.available
    mon.start()
    time.sleep(0.3)
    mon.stop()
    n = len(mon.samples)
    assert 8 <= n <= 20  # ~15 at 20 ms
    gaps = [b.time - a.time for a, b in zip(mon.samples, mon.samples[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.02, abs=0.01)
    time.sleep(0.05)
    assert len(mon.samples) == n  # stopped means stopped


def test_a_failing_sampler_stops_sampling_with_a_note():
    def broken() -> list[GpuSample]:
        raise RuntimeError("GPU is lost")

    mon = GpuMonitor(interval_s=0.01, sampler=broken)
    mon.start()
    time.sleep(0.05)
    mon.stop()
    assert "GPU is lost" in mon.note


def test_stats_per_window():
    samples = [sample(t, util, mem) for t, util, mem in [
        (0.0, 10, 1000), (0.1, 20, 2000), (0.2, 90, 3000), (0.3, 100, 2500),  # window A
        (1.0, 50, 4000), (1.1, 50, 4096),  # window B
    ]]
    mon = GpuMonitor(sampler=lambda: [])
    mon.samples = samples
    a = mon.stats(0.0, 0.35)
    assert a.samples == 4
    assert a.util_mean == pytest.approx(55.0)
    assert a.util_p50 == pytest.approx(55.0)
    assert a.util_p99 == pytest.approx(99.7)  # numpy linear interpolation
    assert a.mem_peak_mib == 3000
    assert a.power_mean_w == pytest.approx(355.0)
    b = mon.stats(0.9, 1.2)
    assert b.util_mean == 50 and b.mem_peak_mib == 4096
    assert gpu_stats([]).util_mean is None


def test_multi_gpu_stats_report_each_device():
    st = gpu_stats([sample(0, 80, 1000, device=0), sample(0, 20, 5000, device=1)])
    assert st.per_device_util_mean == {0: 80.0, 1: 20.0}
    assert st.util_mean == 50.0 and st.mem_peak_mib == 5000


def test_gpu_timeline_plot(tmp_path):
    samples = []
    for i in range(60):
        t = i * 0.1
        for dev in (0, 1):
            s = sample(t, util=30 + (i % 20) * 3 + dev * 5, mem_mib=20000 + i * 50, device=dev)
            samples.append({**s.__dict__, "time": t})
    result = {"label": "fake-gpu", "gpu_samples": samples, "points": [
        {"max_concurrency": 1, "start_s": 0.0, "end_s": 2.5},
        {"max_concurrency": 8, "start_s": 2.6, "end_s": 5.9},
    ]}
    path = plot_gpu_timeline(result, tmp_path / "gpu.png")
    assert path is not None and path.stat().st_size > 20_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_gpu_timeline({"gpu_samples": [], "points": []}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()

"""GPU monitor: samples utilization, memory, power and clocks through NVML while a benchmark runs.

It watches the GPUs of the machine it runs on, so it measures the server only when the benchmark
runs next to it (the usual case for a single-node deployment). Without NVML or a GPU it reports
`available = False` with the reason; that is a note in the report, never an error.

"Utilization" is NVML's GPU utilization: the percentage of the sample period in which at least
one kernel was running (what nvidia-smi shows, and what deployment guides quote). It is not SM
occupancy; 100% means the GPU was never idle, not that it was saturated.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np


@dataclass
class GpuSample:
    time: float  # time.perf_counter()
    device: int
    util_pct: float  # NVML GPU utilization
    mem_util_pct: float  # NVML memory-controller utilization
    mem_used_mib: float
    mem_total_mib: float
    power_w: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None


@dataclass
class GpuStats:
    """Utilization and memory over one window (a sweep point), over all monitored devices."""

    samples: int
    util_mean: float | None = None
    util_p50: float | None = None
    util_p99: float | None = None
    mem_peak_mib: float | None = None  # largest per-device memory in use
    power_mean_w: float | None = None
    sm_clock_mean_mhz: float | None = None
    per_device_util_mean: dict[int, float] = field(default_factory=dict)


Sampler = Callable[[], list[GpuSample]]


class NvmlSampler:
    """Reads one sample per device from NVML. Raises at construction when NVML has no GPU."""

    def __init__(self, devices: list[int] | None = None) -> None:
        import pynvml  # nvidia-ml-py

        self._nvml = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            pynvml.nvmlShutdown()
            raise RuntimeError("NVML found no GPU")
        self.devices = devices if devices is not None else list(range(count))
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.devices]
        self.names = [str(pynvml.nvmlDeviceGetName(h)) for h in self._handles]

    def _optional(self, fn: Callable[[], float]) -> float | None:
        try:
            return float(fn())
        except self._nvml.NVMLError:  # not every board reports power or clocks
            return None

    def __call__(self) -> list[GpuSample]:
        nv, now, out = self._nvml, time.perf_counter(), []
        for dev, h in zip(self.devices, self._handles):
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out.append(GpuSample(
                time=now, device=dev, util_pct=float(util.gpu), mem_util_pct=float(util.memory),
                mem_used_mib=mem.used / 2**20, mem_total_mib=mem.total / 2**20,
                power_w=self._optional(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                sm_clock_mhz=self._optional(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                mem_clock_mhz=self._optional(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            ))
        return out

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


class GpuMonitor:
    """Background thread sampling every `interval_s` seconds between start() and stop()."""

    def __init__(
        self, interval_s: float = 0.1, devices: list[int] | None = None,
        sampler: Sampler | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.samples: list[GpuSample] = []
        self.device_names: list[str] = []
        self.note = ""
        self._sampler: Sampler | None = sampler
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if sampler is None:
            try:
                nvml = NvmlSampler(devices)
                self._sampler, self.device_names = nvml, nvml.names
            except Exception as exc:  # noqa: BLE001 - no GPU is a normal situation
                self.note = f"no GPU monitoring: {type(exc).__name__}: {exc}".strip()

    @property
    def available(self) -> bool:
        return self._sampler is not None

    def start(self) -> None:
        if not self.available or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._sampler is not None
        next_t = time.perf_counter()
        while not self._stop.is_set():
            try:
                self.samples.extend(self._sampler())
            except Exception as exc:  # noqa: BLE001 - a failing read stops sampling, not the run
                self.note = f"GPU sampling stopped: {type(exc).__name__}: {exc}"
                return
            # Fixed-rate schedule, so a slow read does not stretch the interval.
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.perf_counter()))

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
        close = getattr(self._sampler, "close", None)
        if close:
            close()

    def timeline(self, t0: float) -> list[dict]:
        """Every sample as JSON, its time relative to t0 (for the plots)."""
        return [dict(asdict(s), time=s.time - t0) for s in self.samples]

    def stats(self, t0: float, t1: float) -> GpuStats:
        return gpu_stats([s for s in self.samples if t0 <= s.time <= t1])


def gpu_stats(samples: list[GpuSample]) -> GpuStats:
    if not samples:
        return GpuStats(samples=0)
    util = np.array([s.util_pct for s in samples])
    power = [s.power_w for s in samples if s.power_w is not None]
    clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    per_dev: dict[int, list[float]] = {}
    for s in samples:
        per_dev.setdefault(s.device, []).append(s.util_pct)
    return GpuStats(
        samples=len(samples),
        util_mean=float(util.mean()),
        util_p50=float(np.percentile(util, 50)),
        util_p99=float(np.percentile(util, 99)),
        mem_peak_mib=max(s.mem_used_mib for s in samples),
        power_mean_w=float(np.mean(power)) if power else None,
        sm_clock_mean_mhz=float(np.mean(clocks)) if clocks else None,
        per_device_util_mean={d: float(np.mean(v)) for d, v in per_dev.items()},
    )

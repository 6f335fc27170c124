"""GPU utilization and memory gauges through NVML, read at scrape time (absent without a GPU)."""
from __future__ import annotations

import logging

from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger(__name__)


class GpuStats:
    def __init__(self, nvml, handles: list[tuple[int, object]]):
        self.nvml = nvml
        self.handles = handles

    @classmethod
    def open(cls, device_indices: list[int] | None = None) -> GpuStats | None:
        """None when there is no NVML (no driver, no nvidia-ml-py, or no GPU)."""
        try:
            import pynvml
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception:  # any NVML failure just means "no GPU gauges"
            return None
        indices = device_indices if device_indices is not None else list(range(count))
        handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indices if i < count]
        return cls(pynvml, handles) if handles else None

    def collect(self, labels: dict[str, str]):
        names = list(labels) + ["gpu"]
        util = GaugeMetricFamily("autoglm:gpu_utilization_perc",
                                 "GPU utilization (NVML), 1 means 100 percent.", labels=names)
        used = GaugeMetricFamily("autoglm:gpu_memory_used_bytes", "GPU memory in use (NVML).",
                                 labels=names)
        total = GaugeMetricFamily("autoglm:gpu_memory_total_bytes", "GPU memory (NVML).",
                                  labels=names)
        power = GaugeMetricFamily("autoglm:gpu_power_watts", "GPU power draw (NVML).",
                                  labels=names)
        for index, handle in self.handles:
            values = list(labels.values()) + [str(index)]
            try:
                rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:
                logger.debug("NVML read failed for GPU %d: %s", index, exc)
                continue
            util.add_metric(values, rates.gpu / 100.0)
            used.add_metric(values, float(mem.used))
            total.add_metric(values, float(mem.total))
            try:   # not every board reports power
                power.add_metric(values, self.nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            except Exception as exc:
                logger.debug("NVML power read failed for GPU %d: %s", index, exc)
        yield from (util, used, total, power)

"""Prometheus metrics under vLLM's names, so existing Grafana dashboards work unchanged.

Engine state (running, waiting, KV usage, token and prefix-cache counters) is the latest
snapshot the core sent with its outputs, read when /metrics is scraped, so the core pays
nothing for a scrape; per-request latencies are observed by the server when a request ends.
"""
from __future__ import annotations

import time

from prometheus_client import (CollectorRegistry, Counter, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from autoglm_serve.outputs import RequestMetrics

# vLLM's buckets, so quantile panels compare across servers.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)

disable_created_metrics()   # the *_created series double the scrape size and no panel uses them


class _EngineCollector:
    """Gauges and counters that the engine keeps; read at scrape time."""

    def __init__(self, engine, labels: dict[str, str], gpu_stats=None):
        self.engine = engine
        self.labels = labels
        self.gpu_stats = gpu_stats

    def _gauge(self, name: str, doc: str, value: float, extra: dict[str, str] | None = None):
        labels = {**self.labels, **(extra or {})}
        g = GaugeMetricFamily(name, doc, labels=list(labels))
        g.add_metric(list(labels.values()), value)
        return g

    def _counter(self, name: str, doc: str, value: float):
        c = CounterMetricFamily(name, doc, labels=list(self.labels))
        c.add_metric(list(self.labels.values()), value)
        return c

    def collect(self):
        stats, info = self.engine.stats, self.engine.info
        yield self._gauge("vllm:num_requests_running", "Requests in model execution batches.",
                          stats.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be processed.",
                          stats.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc",
                          "KV-cache usage. 1 means 100 percent usage.", stats.kv_usage)
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                            stats.prompt_tokens_total)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            stats.generation_tokens_total)
        yield self._counter("vllm:prefix_cache_queries",
                            "Prefix cache queries, in tokens.", stats.prefix_queries)
        yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.",
                            stats.prefix_hits)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemptions.",
                            stats.num_preemptions)
        config = {"block_size": str(info.kv_block_size), "num_gpu_blocks": str(info.kv_blocks),
                  "max_model_len": str(info.max_model_len), "dtype": f"torch.{info.dtype}",
                  "device": info.device}
        yield self._gauge("vllm:cache_config_info", "Information of the cache config.", 1,
                          config)
        yield self._gauge("autoglm:kv_cache_blocks", "KV-cache blocks.", info.kv_blocks)
        yield self._gauge("autoglm:kv_cache_tokens", "KV-cache capacity in tokens.",
                          info.kv_tokens)
        yield self._gauge("autoglm:kv_cache_bytes", "KV-cache size in bytes (on a CPU its pages "
                          "become resident as blocks are first written).",
                          info.kv_bytes)
        yield self._gauge("autoglm:max_concurrency",
                          "Requests of max_model_len tokens that fit in the KV cache.",
                          info.kv_tokens / info.max_model_len)
        yield self._gauge("autoglm:model_weight_bytes", "Bytes of model weights.",
                          info.weight_bytes)
        if info.has_encoder_cache:   # vision models: ViT runs skipped for images seen before
            yield self._counter("autoglm:encoder_cache_queries",
                                "Image encoder lookups, in images.", stats.encoder_queries)
            yield self._counter("autoglm:encoder_cache_hits",
                                "Image encoder cache hits, in images.", stats.encoder_hits)
        if self.gpu_stats is not None:
            yield from self.gpu_stats.collect(self.labels)


class ServerMetrics:
    def __init__(self, engine, model_name: str, gpu_stats=None):
        self.registry = CollectorRegistry(auto_describe=False)
        labels = {"model_name": model_name, "engine": "0"}
        names = list(labels)
        self._values = list(labels.values())
        self.registry.register(_EngineCollector(engine, labels, gpu_stats))

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=self.registry)

        self.ttft = hist("vllm:time_to_first_token_seconds",
                         "Histogram of time to first token in seconds.", _TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds",
                        "Histogram of inter-token latency in seconds.", _ITL_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.", _ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds",
                        "Histogram of e2e request latency in seconds.", _LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds",
                          "Histogram of time spent in WAITING phase for request.",
                          _LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Histogram of time spent in PREFILL phase for request.",
                            _LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds",
                           "Histogram of time spent in DECODE phase for request.",
                           _LATENCY_BUCKETS)
        self.prompt_len = hist("vllm:request_prompt_tokens",
                               "Number of prefill tokens processed.", _TOKEN_BUCKETS)
        self.gen_len = hist("vllm:request_generation_tokens",
                            "Number of generation tokens processed.", _TOKEN_BUCKETS)
        self.success = Counter("vllm:request_success", "Count of successfully processed "
                               "requests.", names + ["finished_reason"], registry=self.registry)
        self.tpot.labels(*self._values)   # served from the start, as TTFT is, for the dashboards
        self._ttft, self._itl, self._e2e = (self.ttft.labels(*self._values),
                                            self.itl.labels(*self._values),
                                            self.e2e.labels(*self._values))
        for reason in ("stop", "length", "abort"):
            self.success.labels(*self._values, reason)

    def observe_token_gap(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def observe_finished(self, m: RequestMetrics, prompt_tokens: int, output_tokens: int,
                         finish_reason: str) -> None:
        now = time.monotonic()
        values = self._values
        if m.first_token_time is not None:
            self._ttft.observe(m.first_token_time - m.arrival_time)
        self._e2e.observe((m.finished_time or now) - m.arrival_time)
        if m.first_scheduled_time is not None:
            self.queue.labels(*values).observe(m.first_scheduled_time - m.arrival_time)
            if m.first_token_time is not None:
                self.prefill.labels(*values).observe(m.first_token_time - m.first_scheduled_time)
                decode_s = (m.last_token_time or m.first_token_time) - m.first_token_time
                self.decode.labels(*values).observe(decode_s)
                if output_tokens > 1:
                    self.tpot.labels(*values).observe(decode_s / (output_tokens - 1))
        self.prompt_len.labels(*values).observe(prompt_tokens)
        self.gen_len.labels(*values).observe(output_tokens)
        self.success.labels(*values, finish_reason).inc()

    def observe_aborted(self) -> None:
        self.success.labels(*self._values, "abort").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

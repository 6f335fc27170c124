"""One engine replica: an AsyncLLM and `serve`'s FastAPI app, in a Ray Serve replica actor.

Ray gives the actor its GPUs (CUDA_VISIBLE_DEVICES) or CPUs; the engine core runs as under
`serve` (its own process by default). Every response names the replica in the
``x-autoglm-replica`` header. Ray Serve calls ``record_routing_stats`` every few seconds: its
answer (the replica's Prometheus text, its pid) reaches the ingress's router, which is how
/metrics on the ingress shows every replica. ``check_health`` failing makes Ray replace the
replica.
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import socket
from collections.abc import AsyncIterator

from ray import serve

from autoglm_serve.cluster.forwarding import ForwardedRequest, run_asgi

REPLICA_HEADER = "x-autoglm-replica"
logger = logging.getLogger("autoglm_serve.cluster")


class EngineReplica:
    async def __init__(self, args: argparse.Namespace):
        import torch

        from autoglm_serve.engine.async_llm import AsyncLLM
        from autoglm_serve.server.app import build_app
        from autoglm_serve.server.args import engine_config_from_args, settings_from_args
        from autoglm_serve.server.gpu_stats import GpuStats

        self.replica_id = serve.get_replica_context().replica_id.unique_id
        config = engine_config_from_args(args)
        self.settings = settings_from_args(args)
        self.engine = AsyncLLM(config, max_waiting=2 * (config.max_num_seqs
                                                        + self.settings.max_waiting_requests) + 1,
                               core_process=args.engine_process)
        self.engine.start()
        device = torch.device(self.engine.info.device)
        gpu = GpuStats.open([device.index or 0]) if device.type == "cuda" else None
        self.app = build_app(self.engine, self.settings, gpu)
        self.metrics = self.app.state.serving.metrics
        self._header = [(REPLICA_HEADER.encode(), self.replica_id.encode())]
        logger.info("replica %s (pid %d): %s on %s", self.replica_id, os.getpid(),
                    self.engine.info.model_path, self.engine.info.device)
        gc.collect()
        gc.freeze()   # as in launch.py: the collector no longer walks the loaded engine

    async def forward(self, request: ForwardedRequest) -> AsyncIterator[dict]:
        async for message in run_asgi(self.app, request, self._header):
            yield message

    def record_routing_stats(self) -> dict:
        return {"replica": self.replica_id, "pid": os.getpid(), "node": socket.gethostname(),
                "metrics": self.metrics.render().decode()}

    def check_health(self) -> None:
        if self.engine.dead is not None:
            raise RuntimeError(f"the engine core stopped: {self.engine.dead!r}")

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop_requests("the replica is shutting down")
            engine.shutdown()

"""A tensor-parallel worker: rank r of N in its own process, on its own device.

It builds what rank 0's engine core builds (its shard of the model, a runner, a KV cache of
the block count every rank can hold) in the same order, so the start-up collectives meet,
then runs each step rank 0 broadcasts: the same forward on its shard, the image plan's share
of the vision tower, and the sampled tokens rank 0 shares back. It never schedules or samples.

It ends when rank 0 says so (a None step), when rank 0's process is gone (the pipe to it
closes), or on any error, which it reports on the pipe before exiting non-zero.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from multiprocessing.connection import Connection

import torch

from autoglm_serve.engine.core.linear_warm_up import warm_up_linears
from autoglm_serve.engine.parallel.distributed import (agree_min, broadcast_object,
                                                       destroy_groups, init_groups, rank_device)
from autoglm_serve.engine.parallel.layout import ParallelLayout
from autoglm_serve.engine.process.stop_signals import ignore_stop_signals

logger = logging.getLogger(__name__)


def run_worker(rank: int, port: int, settings, conn: Connection, log_level: int) -> None:
    # as the engine core's process: a Ctrl-C or group-wide SIGTERM is the server's to handle
    # (it drains, then stops rank 0, which stops this worker)
    ignore_stop_signals()
    logging.basicConfig(level=log_level, stream=sys.stdout,
                        format=f"%(asctime)s %(levelname)s tp-rank-{rank} %(name)s: %(message)s")
    threading.Thread(target=_exit_with_rank0, args=(conn,), daemon=True).start()
    try:
        worker = Worker(rank, port, settings)
        worker.serve()
    except BaseException as exc:
        logger.error("tensor-parallel worker rank %d failed:\n%s", rank, traceback.format_exc())
        try:
            conn.send(f"{type(exc).__name__}: {exc}"[:500])
        except OSError:
            pass
        os._exit(1)
    destroy_groups()
    os._exit(0)


def _exit_with_rank0(conn: Connection) -> None:
    """Rank 0 never writes to this pipe: it closes when rank 0's process ends."""
    try:
        while True:
            conn.recv()
    except (EOFError, OSError):
        os._exit(1)


class Worker:
    def __init__(self, rank: int, port: int, settings):
        from autoglm_serve.engine.core.engine_core import select_backend
        from autoglm_serve.engine.core.memory_plan import size_kv_cache
        from autoglm_serve.engine.core.model_setup import load_model
        from autoglm_serve.engine.core.runner import ModelRunner
        from autoglm_serve.models.layers.parallel_state import set_tensor_parallel
        config = settings.config
        world = config.tensor_parallel_size
        self.device = rank_device(config.resolve_device(), rank)
        self.groups = init_groups(rank, world, port, self.device)
        set_tensor_parallel(rank, world, config.mm_encoder_tp_mode)
        # the same steps, in the same order, as EngineCore.__init__ on rank 0
        loaded = load_model(settings, self.device)
        runner = self.runner = ModelRunner(
            loaded.model, select_backend(config.attention_backend, self.device), self.device,
            loaded.dtype, config.block_size, settings.max_model_len, config.max_num_seqs,
            settings.max_num_batched_tokens, settings.vocab_size)
        runner.layout = ParallelLayout(rank, world, config.mm_encoder_tp_mode)
        if self.device.type == "cuda":
            runner.check_kernels()
        sizing = size_kv_cache(config, runner, self.device, settings.max_model_len, loaded)
        runner.allocate_kv_cache(agree_min(self.groups, sizing.num_blocks))
        runner.encoder_cache = None       # rank 0's cache decides what is encoded
        if self.device.type == "cuda":
            if agree_min(self.groups, int(runner.wants_cuda_graphs(config))):
                runner.capture_cuda_graphs()
            warm_up_linears(loaded.model, loaded.dtype, settings.max_num_batched_tokens,
                            config.max_num_seqs)

    def serve(self) -> None:
        while True:
            message = broadcast_object(self.groups)
            if message is None:
                return
            self.step(*message)

    @torch.inference_mode()
    def step(self, host_batch, images) -> None:
        runner = self.runner
        runner.bind_kv_cache()
        logits = runner._logits(host_batch, images)
        if logits is not None:     # gathered on every rank: as many rows as rank 0 samples
            tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=self.device)
            torch.distributed.broadcast(tokens, src=0)
            runner._prev_tokens = tokens

"""Rank 0's side of tensor parallelism: it starts ranks 1..N-1 as worker processes, sends them
each step's inputs, shares the sampled tokens, and watches that they live.

A worker that dies (killed, out of memory, a failed collective) can't be replaced mid-step:
rank 0's next collective fails (gloo notices the closed socket at once) and the engine core
stops with a TensorParallelFailure naming the worker, which fails the requests and ends the
server's core process non-zero. Should nothing in rank 0 notice (it waits for requests, or a
NCCL collective hangs), the watchdog ends the process after a grace period where that is the
server's (``exit_process_on_death``); an offline engine's blocked collectives are aborted.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

from autoglm_serve.engine.parallel.distributed import (TensorParallelFailure, agree_min,
                                                       broadcast_object,
                                                       destroy_groups, free_port, init_groups,
                                                       rank_device)
from autoglm_serve.engine.parallel.layout import ParallelLayout
from autoglm_serve.engine.process.stop_signals import start_deaf_to_stop_signals

logger = logging.getLogger(__name__)

# How long rank 0 waits for a failed collective's cause (a worker's exit) to show.
DEATH_NOTICE_S = 2.0
# After a worker died, how long rank 0 gets to notice it itself before the watchdog acts.
GRACE_S = 3.0
# How long the report of an unnoticed death gets to reach the server before the exit.
REPORT_FLUSH_S = 1.0


class TensorParallelWorkers:
    def __init__(self, settings, device: torch.device):
        from autoglm_serve.engine.parallel.worker import run_worker
        config = settings.config
        self.world_size = config.tensor_parallel_size
        self.layout = ParallelLayout(0, self.world_size, config.mm_encoder_tp_mode)
        self.device = rank_device(device, 0)
        self.exit_process_on_death = False    # the server's core sets it (engine/process/)
        # told the reason first, so the server's last words name the worker
        self.report_death: Callable[[TensorParallelFailure], None] | None = None
        self._dead: str | None = None
        self._noticed = threading.Event()      # rank 0 raised on the death itself
        self._closing = False
        ctx = multiprocessing.get_context("spawn")
        port = free_port()
        self.processes, self._pipes = [], []
        for rank in range(1, self.world_size):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=run_worker, name=f"autoglm-tp-worker-{rank}", daemon=True,
                            args=(rank, port, settings, theirs, logging.getLogger().level))
            start_deaf_to_stop_signals(p)
            theirs.close()
            self.processes.append(p)
            self._pipes.append(ours)
        logger.info("tensor parallelism over %d ranks: rank 0 here (pid %d), %s",
                    self.world_size, os.getpid(), ", ".join(
                        f"rank {r} pid {p.pid}" for r, p in enumerate(self.processes, 1)))
        self._watchdog = threading.Thread(target=self._watch, name="tp-watchdog", daemon=True)
        self._watchdog.start()
        try:
            self.groups = init_groups(0, self.world_size, port, self.device)
        except Exception as exc:
            self.close()
            raise self.failure(exc) from exc

    def load_model(self, settings):
        """Rank 0's shard of the model. The layers read the rank while they are built; the
        process' state goes back to one device after, for other engines it may hold."""
        from autoglm_serve.engine.core.model_setup import load_model
        from autoglm_serve.models.layers.parallel_state import set_tensor_parallel
        set_tensor_parallel(0, self.world_size, self.layout.mm_encoder_tp_mode)
        try:
            return load_model(settings, self.device)
        finally:
            set_tensor_parallel(0, 1)

    # ---- start-up agreements and the step -------------------------------------------------
    def agree_min(self, value: int) -> int:
        return self.collective(lambda: agree_min(self.groups, value))

    def send_step(self, host_batch, images) -> None:
        """The step's host inputs and image plan to every worker, in one broadcast."""
        from dataclasses import replace
        message = (replace(host_batch, batch=[], sampling=[]),
                   images.for_other_ranks() if images is not None else None)
        self.collective(lambda: broadcast_object(self.groups, message))

    def share_tokens(self, tokens: torch.Tensor) -> None:
        """The sampled tokens to every rank: the next step's inputs read them on the device."""
        dist.broadcast(tokens, src=0)

    def collective(self, run):
        try:
            return run()
        except Exception as exc:
            raise self.failure(exc) from exc

    def failure(self, exc: BaseException) -> TensorParallelFailure:
        """What a failed collective means, naming the worker that died when one did."""
        deadline = time.monotonic() + DEATH_NOTICE_S
        while self._dead is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self._noticed.set()
        if self._dead is not None:
            return TensorParallelFailure(f"{self._dead}: the engine cannot go on without it")
        if isinstance(exc, TensorParallelFailure):
            return exc
        return TensorParallelFailure(f"a tensor-parallel collective failed ({type(exc).__name__}:"
                                     f" {exc}); the ranks are out of step")

    # ---- liveness -------------------------------------------------------------------------
    def _watch(self) -> None:
        sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self.processes, 1)}
        pipes = {conn: rank for rank, conn in enumerate(self._pipes, 1)}
        reasons: dict[int, str] = {}
        while sentinels:
            try:
                readies = wait(list(sentinels) + list(pipes))
            except (OSError, ValueError):      # closed by close(): nothing left to watch
                return
            for ready in readies:
                if ready in pipes:
                    rank = pipes[ready]
                    try:
                        reasons[rank] = ready.recv()
                    except (EOFError, OSError):
                        del pipes[ready]
                    continue
                rank, p = sentinels.pop(ready)
                p.join()    # only this thread reaps the workers: two reapers race
                if self._closing or self._dead is not None:
                    continue
                how = _how_it_ended(p.exitcode)
                why = f" ({reasons[rank]})" if rank in reasons else ""
                self._dead = f"tensor-parallel worker rank {rank} (pid {p.pid}) {how}{why}"
                logger.error("%s", self._dead)
                threading.Thread(target=self._after_death, daemon=True).start()

    def _after_death(self) -> None:
        if self._noticed.wait(GRACE_S) or self._closing:
            return
        if self.exit_process_on_death:
            logger.critical("%s: the engine core exits", self._dead)
            if self.report_death is not None:
                self.report_death(TensorParallelFailure(self._dead))
                time.sleep(REPORT_FLUSH_S)
            os._exit(1)
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None and dist.is_initialized():   # blocked collectives raise
            abort()

    # ---- the end --------------------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> None:
        if self._closing:
            return
        self._closing = True
        if self._dead is None and hasattr(self, "groups"):
            try:
                broadcast_object(self.groups, None)      # the workers' signal to stop
            except Exception:
                pass
        if self._dead is not None:
            for p in self.processes:
                p.kill()        # the others cannot step without the dead one
        self._watchdog.join(timeout)        # it returns once every worker is reaped
        if self._watchdog.is_alive():
            for p in self.processes:
                p.kill()
            self._watchdog.join()
        for conn in self._pipes:
            conn.close()
        destroy_groups()


def _how_it_ended(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}" if code is not None else "exited"

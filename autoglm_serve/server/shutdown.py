"""How the server stops: drained on SIGTERM, at once (non-zero) when its engine dies.

SIGTERM (or Ctrl-C): the listening socket closes and idle keep-alive connections with it;
requests in flight get --shutdown-timeout seconds to finish. Those still running then (or at
once, on a second Ctrl-C) are ended by the engine with an error a client can read (an SSE error
event then [DONE] for a stream, a 503 for a plain response), never cut off mid-body or with a
task cancelled under them; the engine is shut down and the process exits 0.

An engine core that stopped on an unrecoverable error cannot serve again: rather than answer
503 for ever while its process looks alive to a supervisor, the server drains what it can and
exits 1, so systemd, Kubernetes or a Ray replica restarts it.
"""
from __future__ import annotations

import asyncio
import logging
import time

import uvicorn

logger = logging.getLogger("autoglm_serve.server")

# After the drain timeout, how long the streams that were ended get to send their error.
_ERROR_FLUSH_S = 5.0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine, drain_timeout_s: float):
        super().__init__(config)
        self.engine = engine
        self.drain_timeout_s = drain_timeout_s
        engine.on_dead = self._engine_died

    def _engine_died(self) -> None:
        logger.error("the engine core has stopped and cannot serve again: the server exits "
                     "with status 1 (a supervisor should restart it)")
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()       # idle ones close now, busy ones after their response
        running = self.engine.num_unfinished
        if running:
            logger.info("draining: %d request(s) in flight get %.0f s to finish", running,
                        self.drain_timeout_s)
        if not await self._connections_closed(self.drain_timeout_s, until_forced=True):
            left = self.engine.num_unfinished
            if self.force_exit:
                logger.warning("stopping now (a second signal): ending %d request(s) in flight "
                               "with an error", left)
            else:
                logger.warning("%d request(s) still running after %.0f s: ending them with an "
                               "error", left, self.drain_timeout_s)
            self.engine.stop_requests("the server is shutting down; retry the request")
            # their error events take milliseconds; only a client that does not read waits
            if not await self._connections_closed(_ERROR_FLUSH_S, until_forced=False):
                for task in self.server_state.tasks:   # such a client: last resort
                    task.cancel()
        for server in self.servers:
            await server.wait_closed()
        # unlike uvicorn, also when forced: the engine's shutdown is bounded and stops its core
        await self.lifespan.shutdown()

    async def _connections_closed(self, timeout_s: float, until_forced: bool) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.server_state.connections or self.server_state.tasks:
            if (until_forced and self.force_exit) or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

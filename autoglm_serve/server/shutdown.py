"""How the server stops: drained on SIGTERM, at once (non-zero) when its engine dies.

SIGTERM (or Ctrl-C): the listening socket closes and idle keep-alive connections with it;
requests in flight get --shutdown-timeout seconds to finish. Those still running then are ended
by the engine with an error a client can read (an SSE error event then [DONE] for a stream, a
503 for a plain response), never cut off mid-body or with a task cancelled under them; the
engine is shut down and the process exits 0.

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
            logger.info("draining: %d requests in flight get %.0f s to finish", running,
                        self.drain_timeout_s)
        if not await self._connections_closed(self.drain_timeout_s):
            left = self.engine.num_unfinished
            logger.warning("%d requests still running after %.0f s: ending them with an error",
                           left, self.drain_timeout_s)
            self.engine.stop_requests("the server is shutting down; retry the request")
            if not await self._connections_closed(_ERROR_FLUSH_S):
                for task in self.server_state.tasks:   # a client that does not read: last resort
                    task.cancel()
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _connections_closed(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.server_state.connections or self.server_state.tasks:
            if self.force_exit or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

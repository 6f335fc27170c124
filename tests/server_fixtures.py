"""A real server for tests: `python -m autoglm_serve.cli serve ...` on 127.0.0.1 and a free port.

    with ServerProcess(["--max-model-len", "2048"]) as server:
        httpx.get(server.url("/health"))

The log goes to a file; when a test fails, its tail is printed so the server's side is visible.
Every process the server starts inherits a marker in its environment, so a test can check that
none outlives it (the engine core's process, multiprocessing's helpers).
"""
from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from autoglm_serve.bench.server_process import ServerProcess as BaseServerProcess
from autoglm_serve.bench.server_process import free_port

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 600.0   # the shared CPU machine can be slow to load even a 135M model


def _environment(env: dict[str, str | None]) -> dict[str, str]:
    """The server's environment; a name given as None is removed from it."""
    return {k: v for k, v in env.items() if v is not None}


class ServerProcess(BaseServerProcess):
    def __init__(self, args: list[str], *, module: str = "autoglm_serve.cli",
                 subcommand: str | None = "serve", api_key: str | None = None,
                 env: dict[str, str | None] | None = None):
        port = free_port()
        self.api_key = api_key
        self.marker = uuid.uuid4().hex
        cmd = [sys.executable, "-m", module] + ([subcommand] if subcommand else [])
        super().__init__(
            cmd + list(args) + ["--host", "127.0.0.1", "--port", str(port)], port,
            tempfile.mkstemp(prefix="autoglm-server-", suffix=".log")[1],
            env=_environment({**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                              "TOKENIZERS_PARALLELISM": "false",
                              "AUTOGLM_TEST_SERVER": self.marker, **(env or {})}), cwd=ROOT)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self, timeout: float = START_TIMEOUT_S) -> ServerProcess:
        return super().start(timeout)

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url("/health"), timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def core_pid(self) -> int | None:
        """The engine core's process, from the start-up report (None: a thread)."""
        m = re.search(r"engine core: its own process \(pid (\d+)\)", self.log(tail=10**6))
        return int(m.group(1)) if m else None

    def processes(self) -> list[int]:
        """Live processes started by this server (itself included): they carry its marker."""
        return processes_with_marker(self.marker)

    def metrics(self) -> dict[str, float]:
        """Prometheus samples by name+labels, e.g. 'vllm:num_requests_running{...}'."""
        text = httpx.get(self.url("/metrics"), timeout=10).text
        return parse_metrics(text)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def processes_with_marker(marker: str) -> list[int]:
    needle = f"AUTOGLM_TEST_SERVER={marker}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:   # gone meanwhile, or not ours to read
            pass
    return pids


def wait_gone(server: ServerProcess, timeout: float = 15) -> list[int]:
    """Waits for every process of a stopped server to end; returns those still alive."""
    deadline = time.monotonic() + timeout
    while (left := server.processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def metric(samples: dict[str, float], name: str) -> float:
    """Sum of a metric's samples over its labels."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def server_fixture(args: list[str], **kwargs):
    """A module-scoped pytest fixture body: yields a started server, prints its log on failure."""
    server = ServerProcess(args, **kwargs).start()
    try:
        yield server
    finally:
        code = server.stop()
        if code not in (0, None):
            print(f"server exited with {code}; log tail:\n{server.log()}")
        left = wait_gone(server)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind by the server: {left}"

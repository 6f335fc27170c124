"""A server (ours or a peer's) as a child process, for the tuner, the benchmarks, the soak and the
tests: in its own process group, dying with its parent, its output in a log file, ready once
/health answers.

Stopping signals the server itself, which drains and stops its own workers (our engine core's
process); only a server that has not exited in time is killed with its whole group.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux), so a killed benchmark
    or test run leaves no server behind."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except OSError:
        pass


class ServerProcess:
    def __init__(self, cmd: list[str], port: int, log_path: str | Path,
                 env: dict[str, str] | None = None, cwd: str | Path | None = None):
        self.cmd, self.port, self.log_path = cmd, port, Path(log_path)
        self.env, self.cwd = env, cwd
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def spawn(self) -> ServerProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=self.cwd, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        return self

    def start(self, timeout_s: float) -> ServerProcess:
        """Spawned and healthy, or stopped and a RuntimeError saying why (the log's tail)."""
        why = self.spawn().wait_healthy(timeout_s)
        if why is not None:
            self.stop(timeout=10)
            raise RuntimeError(f"server {why}\n{self.log(4000)}")
        return self

    def wait_healthy(self, timeout_s: float, path: str = "/health") -> str | None:
        """None once GET path answers 200, else why not (exited, or not in time)."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5, trust_env=False) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return f"exited with code {self.proc.returncode}: {self.log_tail()}"
                try:
                    if http.get(self.url(path)).status_code == 200:
                        return None
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        return f"not healthy after {timeout_s:g} s: {self.log_tail()}"

    def log(self, tail: int = 8000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def log_tail(self, lines: int = 3) -> str:
        return " | ".join(self.log().strip().splitlines()[-lines:])[-400:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        """The server's exit code (None if it was never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        return self.proc.returncode

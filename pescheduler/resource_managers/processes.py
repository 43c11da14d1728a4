"""Background processes a resource manager starts: started with a log file, stopped by PID.

Every process (a Dask worker, a Spark JVM) is stopped by the code that
started it, through the :class:`Process` handle it kept: SIGTERM, a bounded
wait, then SIGKILL. Nothing is ever looked up or killed by name.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import tempfile
from dataclasses import dataclass

TERM_WAIT_S = 10.0


@dataclass
class Process:
    """A started process, its command and the file its output goes to."""

    name: str
    popen: subprocess.Popen
    log_path: str

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = TERM_WAIT_S) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code (blocking)."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(TERM_WAIT_S)
        return self.popen.returncode

    async def astop(self, timeout: float = TERM_WAIT_S) -> int | None:
        return await asyncio.to_thread(self.stop, timeout)

    async def wait_exit(self, timeout: float) -> bool:
        """True if the process exits on its own within ``timeout``."""
        try:
            await asyncio.to_thread(self.popen.wait, timeout)
            return True
        except subprocess.TimeoutExpired:
            return False


def start(name: str, cmd: list[str], env: dict | None = None, log_dir: str | None = None) -> Process:
    """Start ``cmd`` in its own session (Ctrl-C of the terminal does not reach it), output to a log."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="pescheduler-rm-")
    log_path = os.path.join(log_dir, f"{name}.log")
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **(env or {})}, start_new_session=True)
    return Process(name, popen, log_path)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now (the OS picks it; a race with another process is possible but rare)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


"""Background processes a resource manager starts: started with a log file, stopped by PID.

Every process (a Dask worker, a Spark JVM) is stopped by the code that
started it, through the :class:`Process` handle it kept: SIGTERM, a bounded
wait, then SIGKILL. Nothing is ever looked up or killed by name.

A process that would outlive a deploying process killed before it could stop
it (a Spark standalone master or worker: nothing in it watches the driver,
where a Dask worker gives up after ``--death-timeout``) is started ``tied``:
through ``setpriv --pdeathsig TERM`` (util-linux), from one thread of this
process that lives as long as it does (:func:`_spawner`, :func:`tie`), so the kernel sends
it SIGTERM when this process dies, however. The signal follows the thread that
started the process, not the process: started from a passing thread (the
resource manager starts its cluster from one), it would come when that thread
ended.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

logger = logging.getLogger(__name__)

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


def start(name: str, cmd: list[str], env: dict | None = None, log_dir: str | None = None,
          tied: bool = False) -> Process:
    """Start ``cmd`` in its own session (Ctrl-C of the terminal does not reach it), output to a log;
    ``tied``: stopped by the kernel when this process dies (module docstring)."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="pescheduler-rm-")
    log_path = os.path.join(log_dir, f"{name}.log")
    with open(log_path, "ab") as log:
        def popen() -> subprocess.Popen:
            return subprocess.Popen([*(tie() if tied else ()), *cmd], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                                    start_new_session=True)
        return Process(name, _spawner().submit(popen).result() if tied else popen(), log_path)


_SPAWNER: list[ThreadPoolExecutor] = []
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    """The one thread tied processes are started from: idle, it waits for the next, so it ends only
    with this process (or at its exit, when what it started gets SIGTERM too)."""
    with _SPAWNER_LOCK:
        if not _SPAWNER:
            _SPAWNER.append(ThreadPoolExecutor(1, thread_name_prefix="pescheduler-spawner"))
        return _SPAWNER[0]


_UNTIED: list[bool] = []       # said once that there is no setpriv


def tie(signal_name: str = "TERM") -> tuple[str, ...]:
    """The command prefix that has the kernel send ``SIG<signal_name>`` to the started process when
    the thread starting it dies (kept across ``exec``: ``spark-class`` execs its JVM; not by the
    process's own children); none, said once, where the machine has no ``setpriv``."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        if not _UNTIED:
            _UNTIED.append(True)
            logger.warning("no setpriv (util-linux) on this machine: what this process starts tied (a Spark "
                           "cluster's daemons) keeps running if the process is killed before it stops them")
        return ()
    return setpriv, "--pdeathsig", signal_name


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now (the OS picks it; a race with another process is possible but rare)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


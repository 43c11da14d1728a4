"""``stop NAME`` of an embedded deployment through a Unix socket of its deploying process.

Why: asking through the scheduler needs a Dask client, and importing
``distributed`` alone costs ``stop`` about 0.4 s of its 0.48 s (issue 34: goal
0.3 s). The deploying process of an embedded deployment is on this machine and
already has a state directory (:mod:`.statefile`), so it listens on
``<state-dir>/<name>.sock`` (mode 0600: only its user may connect) and
``stop`` connects with the standard library alone.

The exchange, one line each way and then one more::

    stop  ->  "stop\\n"
          <-  "stopping\\n"   (or "ended <state>\\n": nothing to stop)
          <-  "ended <state>\\n" once the deployment has drained (or failed)

A deployment on ``--cluster`` has no socket: ``stop`` asks its scheduler, as
before. A socket that refuses or does not answer (its process is gone or
hung: a stale file) makes :func:`ask_to_stop` return None, and ``stop``
falls back to the scheduler's path. Every wait is bounded.

Example::

    server = await StopServer.start("nightly", request_stop, done, lambda: state.state)
    ...
    await server.close()           # removes the socket file
    ask_to_stop("nightly", timeout=60)   # from another process: "stopped"
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from typing import Awaitable, Callable

from . import statefile

ANSWER_S = 5.0          # how long a live deploying process may take to acknowledge a stop
MAX_PATH = 100          # a Unix socket's path is at most 107 bytes (108 with its NUL) on Linux


def socket_path(name: str) -> str | None:
    """Where the deploying process of ``name`` listens; None when the path is too long to bind."""
    path = os.path.join(statefile.directory(), f"{name}.sock")
    return path if len(os.fsencode(path)) <= MAX_PATH else None


class StopServer:
    """The deploying process's end: accepts ``stop``, calls ``request_stop`` once, answers the state
    once ``done`` is set."""

    def __init__(self, path: str, done: asyncio.Event, request_stop: Callable[[], Awaitable[None]],
                 state: Callable[[], str]) -> None:
        self.path, self._done = path, done
        self._request_stop, self._state = request_stop, state
        self._server: asyncio.AbstractServer | None = None
        self._inode = -1             # the socket file this one bound (close removes only that one)

    @classmethod
    async def start(cls, name: str, request_stop: Callable[[], Awaitable[None]], done: asyncio.Event,
                    state: Callable[[], str]) -> "StopServer | None":
        """Listen for ``name`` (None when its path cannot be bound: ``stop`` then uses the scheduler)."""
        path = socket_path(name)
        if path is None:
            return None
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)          # a stale socket of a killed process of this name (the name is ours now)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)    # before listen(): nobody connects while it is wider
            sock.listen(4)
        except OSError:
            sock.close()
            return None
        self = cls(path, done, request_stop, state)
        self._inode = os.stat(path).st_ino
        self._server = await asyncio.start_unix_server(self._serve, sock=sock)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), ANSWER_S)
            if line.strip() != b"stop":
                writer.write(b"error: unknown command\n")
                return
            if not self._done.is_set():
                writer.write(b"stopping\n")
                await writer.drain()
                await self._request_stop()
                await self._done.wait()
            writer.write(f"ended {self._state()}\n".encode())
            await writer.drain()
        except (OSError, asyncio.TimeoutError):
            pass                      # the asking process went away: nothing to answer
        finally:
            writer.close()

    async def close(self) -> None:
        """Stop listening and remove the socket file (only ours: a newer deployment's is left)."""
        self._server.close()
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.remove(self.path)


def ask_to_stop(name: str, timeout: float, said: Callable[[], None] = lambda: None) -> str | None:
    """Ask the deploying process of ``name`` to stop; its final state once it has, or None when
    nobody answers on its socket (none, stale, or not acknowledged within :data:`ANSWER_S`).
    ``said`` is called once the stop is acknowledged. TimeoutError: acknowledged but not ended
    within ``timeout``."""
    path = socket_path(name)
    if path is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(ANSWER_S)
        try:
            sock.connect(path)
            sock.sendall(b"stop\n")
            stream = sock.makefile("rb")
            first = stream.readline().decode().strip()
        except OSError:               # socket.timeout included: a hung or gone process
            return None
        if first.startswith("ended "):
            return first.split(" ", 1)[1]
        if first != "stopping":
            return None
        said()
        deadline = time.monotonic() + timeout
        sock.settimeout(timeout)
        try:
            last = stream.readline().decode().strip()
        except TimeoutError:
            raise TimeoutError(f"not ended within {timeout:.0f} s") from None
        except OSError:
            last = ""
        if last.startswith("ended "):
            return last.split(" ", 1)[1]
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not ended within {timeout:.0f} s")
        return "stopped"              # the process closed the socket as it exited: it stopped
    finally:
        sock.close()

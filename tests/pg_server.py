"""A real PostgreSQL server for tests: Debian's package, a fresh cluster in a temp dir, a child of this process.

``running()`` installs ``postgresql`` when missing (tests/debian.py),
``initdb``s a cluster into a temp dir of its own and runs ``postgres`` in the
foreground as a child of this process on a free port, with its unix socket in
that dir (no TCP listener); it yields a ``postgresql://`` URL and stops that
one server by its PID (SIGINT, PostgreSQL's fast shutdown) at the end. The
server refuses to run as root, so as root the cluster belongs to the
``postgres`` user the package creates (and lives in a fresh dir under /tmp that
user can reach, not under pytest's root-only tmp), removed at the end.

A test process killed with SIGKILL runs no ``finally``, so two things make its
server go anyway: ``setpriv --pdeathsig INT`` (util-linux) has the kernel send
the server SIGINT when this process dies, and each dir records its owner
(PID and start in ``owner``: ``pescheduler.process_start``, which a step of
the wall clock does not move): the next ``running()`` removes the dirs
whose owner is gone, first stopping a server still running there (the PID in
its ``postmaster.pid``, checked to be a ``postgres`` on that data dir). A dir
of a live owner, another developer's run, is never touched.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from typing import Iterator

import psutil

from debian import dies_with_this_process, require
from pescheduler.process_start import started
from waiting import gone, until

PREFIX = "pescheduler-pg-"


def _bin_dirs() -> tuple[str, ...]:
    """Where Debian puts the server binaries (not on PATH): the installed versions, newest first, then
    the versions a fresh install may bring (looked for again after installing)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    return (*found, *(f"/usr/lib/postgresql/{v}/bin" for v in range(18, 12, -1)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(wal_level: str = "logical") -> Iterator[str]:
    """A server with ``wal_level`` (``logical`` by default, so the ``postgres_cdc`` source can decode
    its changes through replication slots; ``replica``/``minimal`` to test the refusal)."""
    remove_stale()
    with tempfile.TemporaryDirectory(prefix=PREFIX) as tmp:
        me = psutil.Process()
        with open(os.path.join(tmp, "owner"), "w") as f:
            json.dump({"pid": me.pid, "started": me.create_time(), "start": started(me.pid)}, f)
        yield from _server(tmp, wal_level)


def _server(tmp: str, wal_level: str) -> Iterator[str]:
    initdb = require("initdb", "postgresql", search=_bin_dirs())
    postgres = os.path.join(os.path.dirname(initdb), "postgres")
    user = "postgres" if os.geteuid() == 0 else None
    data, sock = os.path.join(tmp, "data"), os.path.join(tmp, "sock")
    os.makedirs(sock, exist_ok=True)
    if user:
        shutil.chown(tmp, user)
        shutil.chown(sock, user)
    done = subprocess.run([initdb, "-D", data, "-U", "postgres", "-A", "trust", "--no-sync"],
                          user=user, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    port = _free_port()
    with open(os.path.join(tmp, "log"), "wb") as log:
        server = subprocess.Popen(
            [*dies_with_this_process("INT"), postgres, "-D", data, "-p", str(port), "-k", sock,
             "-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off",
             "-c", f"wal_level={wal_level}", *_replication(wal_level)],
            user=user, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        until(lambda: server.poll() is not None or _ready(data), 60, "postgres to accept connections")
        if server.poll() is not None:
            raise RuntimeError(f"postgres exited ({server.returncode}):\n{_tail(tmp)}")
        yield f"postgresql://postgres@/postgres?host={sock}&port={port}"
    finally:
        _stop(server)


def _replication(wal_level: str) -> list[str]:
    """Replication slots for ``logical`` (a few tests' slots at once); ``minimal`` must have no WAL senders."""
    if wal_level == "minimal":
        return ["-c", "max_wal_senders=0"]
    return ["-c", "max_replication_slots=20", "-c", "max_wal_senders=20"]


def _ready(data: str) -> bool:
    """postmaster.pid's 8th line is the server's status: ``ready`` once it accepts connections."""
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return False
    return len(lines) >= 8 and lines[7].strip() == "ready"


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGINT)        # fast shutdown: ends the sessions, then the server
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _tail(tmp: str) -> str:
    with open(os.path.join(tmp, "log"), errors="replace") as f:
        return f.read()[-3000:]


def remove_stale(folder: str | None = None) -> list[str]:
    """Remove the dirs (in ``folder``, by default the temp directory ``running()`` uses) of servers
    whose owning process is gone (SIGKILLed runs); returns them."""
    removed = []
    for tmp in glob.glob(os.path.join(folder or tempfile.gettempdir(), PREFIX + "*")):
        try:
            with open(os.path.join(tmp, "owner")) as f:
                owner = json.load(f)
        except (OSError, ValueError):
            continue                              # not (yet) recorded: not ours to judge
        if _alive(owner):
            continue
        server = _postmaster(os.path.join(tmp, "data"))
        if server is not None:
            server.kill()
            gone([server.pid], 30, f"the stale postgres {server.pid} of {tmp}")
        shutil.rmtree(tmp, ignore_errors=True)
        removed.append(tmp)
    return removed


def _alive(owner: dict) -> bool:
    """Is the process that wrote ``owner`` still running? By ``pescheduler.process_start``'s
    start where recorded (it does not move with a step of the wall clock, as psutil's
    ``create_time`` does: a loaded suite's ``remove_stale`` removed three live servers' dirs)."""
    if "start" in owner:
        return started(owner["pid"]) == owner["start"]
    try:
        return abs(psutil.Process(owner["pid"]).create_time() - owner["started"]) < 1
    except psutil.NoSuchProcess:
        return False


def _postmaster(data: str) -> psutil.Process | None:
    """The server its ``postmaster.pid`` names, if that PID still is a postgres on ``data``."""
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            proc = psutil.Process(int(f.readline()))
        return proc if data in proc.cmdline() else None
    except (OSError, ValueError, psutil.Error):
        return None

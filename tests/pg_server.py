"""A real PostgreSQL server for tests: Debian's package, a fresh cluster in a temp dir, stopped by its pg_ctl.

``running()`` installs ``postgresql`` when missing (tests/debian.py),
``initdb``s a cluster into a temp dir of its own, starts it with ``pg_ctl`` on a free port
with its unix socket in ``tmp`` (no TCP listener), yields a
``postgresql://`` URL, and stops that one server with ``pg_ctl stop``
(which signals the PID in its own ``postmaster.pid``) at the end. The server
refuses to run as root, so as root the cluster belongs to the ``postgres``
user the package creates (and lives in a fresh dir under /tmp that user can
reach, not under pytest's root-only tmp), removed at the end.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from typing import Iterator

from debian import require


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
def running() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="pescheduler-pg-") as tmp:
        yield from _server(tmp)


def _server(tmp: str) -> Iterator[str]:
    initdb = require("initdb", "postgresql", search=_bin_dirs())
    pg_ctl = os.path.join(os.path.dirname(initdb), "pg_ctl")
    user = "postgres" if os.geteuid() == 0 else None
    data, sock = os.path.join(tmp, "data"), os.path.join(tmp, "sock")
    os.makedirs(sock, exist_ok=True)
    if user:
        shutil.chown(tmp, user)
        shutil.chown(sock, user)
    run = dict(user=user, capture_output=True, text=True, timeout=120)
    _run([initdb, "-D", data, "-U", "postgres", "-A", "trust", "--no-sync"], run)
    port = _free_port()
    options = f"-p {port} -k {sock} -c listen_addresses='' -c fsync=off -c synchronous_commit=off"
    _run([pg_ctl, "start", "-w", "-t", "60", "-D", data, "-l", os.path.join(tmp, "log"), "-o", options], run)
    try:
        yield f"postgresql://postgres@/postgres?host={sock}&port={port}"
    finally:
        _run([pg_ctl, "stop", "-w", "-t", "60", "-m", "fast", "-D", data], run)


def _run(cmd: list[str], options: dict) -> None:
    done = subprocess.run(cmd, **options)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({done.returncode}):\n{done.stdout}{done.stderr}")

"""Debian packages the tests need (a broker, a database, a browser), installed by the test setup itself.

CI and a fresh machine start with none of them, and nothing installed by hand
survives, so a fixture that needs ``redis-server`` calls
``require("redis-server", "redis-server")`` before starting it. The first call
on a machine runs ``apt-get update`` and ``apt-get install -y``; later calls
find the binary and return at once. Installing needs root (the test machines
run as root); without it the fixture fails saying which package to install.
One install at a time on the machine: a parallel run's workers (pytest-xdist) are processes, and
two of them needing a package at once would otherwise both run ``apt-get``, the second failing
on dpkg's lock; so an install holds ``flock`` on a file in the temp directory as well.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import threading

_lock = threading.Lock()
_updated = False


def require(binary: str, package: str, *, search: tuple[str, ...] = ()) -> str:
    """Path of ``binary`` (also looked for in ``search`` folders), installing ``package`` if missing."""
    return _ensure(lambda: _which(binary, search), package, binary)


def require_library(name: str, package: str) -> str:
    """The shared library ``name`` as the dynamic linker finds it (``ctypes.util.find_library``:
    ``"jemalloc"`` -> ``"libjemalloc.so.2"``), installing ``package`` if missing."""
    import ctypes.util

    return _ensure(lambda: ctypes.util.find_library(name), package, f"lib{name}")


def _ensure(find, package: str, what: str) -> str:
    """``find()``, after installing ``package`` if it found nothing (one install at a time)."""
    found = find()
    if found:
        return found
    with _lock, _machine_lock():
        found = find()              # another process may have installed it while we waited
        if not found:
            _install(package)
            found = find()
    if not found:
        raise RuntimeError(f"{what} is still missing after 'apt-get install -y {package}'")
    return found


@contextlib.contextmanager
def _machine_lock():
    """Held by one process of this machine at a time (released when it closes the file, or dies)."""
    with open(os.path.join(tempfile.gettempdir(), "pescheduler-tests-apt.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _which(binary: str, search: tuple[str, ...]) -> str | None:
    for folder in search:
        path = os.path.join(folder, binary)
        if os.access(path, os.X_OK):
            return path
    return shutil.which(binary)


def _install(package: str) -> None:
    global _updated
    if os.geteuid() != 0:
        raise RuntimeError(f"the tests need the Debian package {package!r}: apt-get install -y {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _updated:
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env, capture_output=True, timeout=600)
        _updated = True
    done = subprocess.run(["apt-get", "install", "-y", "-q", package], env=env, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"apt-get install -y {package} failed:\n{done.stderr[-2000:]}")


def dies_with_this_process(signal_name: str = "TERM") -> tuple[str, ...]:
    """``processes.tie``'s prefix (``setpriv --pdeathsig``, util-linux, installed if missing): the
    kernel sends the started process ``SIG<signal_name>`` when the thread starting it dies, so a
    server a test fixture started goes with a test process killed before its ``finally``."""
    from pescheduler.resource_managers.processes import tie

    require("setpriv", "util-linux")
    return tie(signal_name)

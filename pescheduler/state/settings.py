"""Which backend a KEYED operator's state lives in, and where: ``pescheduler.state.*``.

The backend is the deployment's choice (``deploy(state=)``, ``deploy --state``,
else ``pescheduler.state.backend``), carried to the operator in
``context.extra["state"]``; the directory and the cache are the worker's own
settings (``pescheduler.state.dir``, ``pescheduler.state.cache``), read where
the store opens.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import tempfile
import uuid
from typing import Any

import psutil
from dask.utils import parse_bytes

from .. import config
from ..errors import ConfigError
from .base import KeyedState
from .local import LocalCopies, listed

BACKENDS = ("memory", "disk")


def backend_name(chosen: str | None = None) -> str:
    """``chosen`` checked, or ``pescheduler.state.backend``; ValueError names the known ones."""
    name = config.get("state.backend") if chosen is None else chosen
    if name not in BACKENDS:
        raise ValueError(f"state backend {name!r} is unknown; choose one of {', '.join(BACKENDS)} "
                         f"(deploy(state=), --state or pescheduler.state.backend)")
    return name


def cache_bytes() -> int:
    """``pescheduler.state.cache`` in bytes (``256MB``, ``1GiB`` or a number)."""
    raw = config.get("state.cache")
    try:
        return parse_bytes(raw) if isinstance(raw, str) else int(raw)
    except (ValueError, TypeError):
        raise ValueError(f"pescheduler.state.cache: {raw!r} is not a size such as 256MB") from None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]


def state_base() -> str:
    """``<pescheduler.state.dir>/pescheduler-state`` (null dir: the temp directory): every
    deployment's directory on this machine (:func:`machine_dir`)."""
    return os.path.join(os.path.expanduser(config.get("state.dir") or tempfile.gettempdir()), "pescheduler-state")


def check_state_dir() -> None:
    """:class:`~pescheduler.errors.ConfigError` naming ``pescheduler.state.dir`` unless this
    machine's workers can make their directories there (made if missing, owner-only): checked
    before an embedded cluster's workers start, which share this process's settings. A directory
    that cannot be made failed each PE of a ``disk`` deployment at its first store, after the start
    (a traceback ending in ``FileNotFoundError``), and each checkpoint's local copies with it."""
    base = state_base()
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
        probe = tempfile.mkdtemp(dir=base)
        os.rmdir(probe)
    except OSError as exc:
        raise ConfigError(_unwritable(base, exc)) from None


def _unwritable(path: str, exc: OSError) -> str:
    return (f"pescheduler.state.dir: the workers' state directory {path} cannot be made or written "
            f"({type(exc).__name__}: {exc.strerror or exc}); set pescheduler.state.dir (PESCHEDULER__STATE__DIR) "
            f"to a writable directory, or null for the system's temp directory")


def machine_dir(deployment: str) -> str:
    """``<pescheduler.state.dir>/pescheduler-state/<deployment>`` (null dir: the temp directory):
    the deployment's directory on this machine, one :func:`deployment_dir` of each worker in it."""
    return os.path.join(state_base(), _safe(deployment))


def deployment_dir(deployment: str) -> str:
    """This process's directory of the deployment (its operators' stores, its checkpoint copies:
    state/local.py, the files a lazy restore makes ready): ``<machine_dir>/p<pid>-<start>-<host>``, its
    own even beside other workers of the machine. Both workers of an embedded cluster share the
    state directory, and shared one directory: each removed the other's checkpoint copies as its
    own checkpoints completed (no chain of its own named them), and a worker's end of the
    deployment removed the other's stores with its own."""
    return os.path.join(machine_dir(deployment), _own_name(os.getpid()))


@functools.lru_cache(maxsize=None)
def _own_name(pid: int) -> str:
    """This process's :func:`_name_of`, by pid (a worker forked from a server that imported this
    module has a pid of its own)."""
    return _name_of(pid)


def _name_of(pid: int) -> str:
    """``p<pid>-<its start, ms since the epoch>-<this machine's name>``: a process's, told from a
    later one with its pid, and from another machine's (a state directory shared by mistake)."""
    return f"p{pid}-{round(psutil.Process(pid).create_time() * 1000)}-{_safe(socket.gethostname())}"


def _gone(name: str) -> bool:
    """Whether the process a :func:`deployment_dir`'s name names has ended (a SIGKILLed worker's);
    one of another machine's, or not a process's directory, is not known to have: left alone."""
    m = re.fullmatch(r"p(\d+)-\d+-(.+)", name)
    if m is None or m.group(2) != _safe(socket.gethostname()):
        return False
    try:
        return _name_of(int(m.group(1))) != name     # its pid another process's now, or none's
    except psutil.Error:                # no such process
        return True


def local_copies(deployment: str) -> LocalCopies | None:
    """This worker's copies of ``deployment``'s files (in :func:`deployment_dir`: local recovery,
    state/local.py), or None when ``pescheduler.state.local-recovery`` is off on this worker:
    nothing is copied, every restore reads the storage."""
    return LocalCopies(deployment_dir(deployment)) if config.get("state.local-recovery") else None


def store_dir(owner: str, deployment: str = "local") -> str:
    """A fresh directory for one store, in its deployment's directory."""
    path = os.path.join(deployment_dir(deployment), f"{_safe(owner)}-{uuid.uuid4().hex[:12]}")
    try:
        os.makedirs(path)
    except OSError as exc:              # a worker's own settings (another machine's): said as such
        raise ConfigError(_unwritable(os.path.dirname(path), exc)) from exc
    return path


def remove_stores(deployment: str, keep: tuple[str, ...] = ()) -> None:
    """Remove every store of ``deployment`` on this worker (its PE host calls it when the
    deployment ends here, or its PEs stop for a recovery: operators leave their stores open, see
    :func:`keyed_state`) but the entries of its directory named in ``keep`` (a recovery's: the
    checkpoint copies), and the directories of this machine's workers of it that have ended (a
    SIGKILL leaves its stores and copies behind); a live worker's are its own to remove."""
    mine = deployment_dir(deployment)
    if keep:
        for name in (n for n in listed(mine) if n not in keep):
            shutil.rmtree(os.path.join(mine, name), ignore_errors=True)
    else:
        shutil.rmtree(mine, ignore_errors=True)
    machine = machine_dir(deployment)
    for name in listed(machine):
        if _gone(name):
            shutil.rmtree(os.path.join(machine, name), ignore_errors=True)
    try:
        os.rmdir(machine)               # the last worker of it here: nothing of the deployment is left
    except OSError:
        pass


def open_state(backend: str | None = None, owner: str = "state", deployment: str = "local") -> KeyedState:
    """A new, empty keyed state of ``backend`` (default ``pescheduler.state.backend``)."""
    name = backend_name(backend)
    if name == "memory":
        from .memory import MemoryState

        return MemoryState()
    from .disk import DiskState

    budget = cache_bytes()                 # a bad size fails before any directory is made
    return DiskState(store_dir(owner, deployment), budget)


def keyed_state(context: Any, name: str = "state") -> KeyedState:
    """The keyed state of an operator being opened: its deployment's backend, a store of its own.

    Call it in ``open`` (after ``super().open(context)``)::

        def open(self, context):
            super().open(context)
            self.state = keyed_state(context)

    Leave it open in the operator's ``close``: a PE that finished may still be snapshotted
    (a Release of its copy); a disk store is removed when the state is garbage-collected or,
    at the latest, when its deployment ends on the worker (:func:`remove_stores`).
    """
    owner = "-".join(p for p in (context.pe_id, context.op_id, f"c{context.copy_index}", name) if p)
    return open_state(context.extra.get("state"), owner, context.extra.get("deployment", "local"))


def adopt(context: Any, held: KeyedState, name: str = "state") -> KeyedState:
    """The operator's state in its deployment's backend (``keyed_state``, ``name`` naming its store),
    holding what ``held`` holds: an operator keeps a ``MemoryState`` until ``open`` because
    ``restore`` comes first."""
    if backend_name(context.extra.get("state")) == held.backend:
        return held
    chosen = keyed_state(context, name)
    chosen.import_groups(held.export_groups())
    held.close()
    return chosen

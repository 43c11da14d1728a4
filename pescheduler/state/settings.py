"""Which backend a KEYED operator's state lives in, and where: ``pescheduler.state.*``.

The backend is the deployment's choice (``deploy(state=)``, ``deploy --state``,
else ``pescheduler.state.backend``), carried to the operator in
``context.extra["state"]``; the directory and the cache are the worker's own
settings (``pescheduler.state.dir``, ``pescheduler.state.cache``), read where
the store opens.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import uuid
from typing import Any

import psutil
from dask.utils import parse_bytes

from .. import config
from ..errors import ConfigError
from .base import KeyedState
from .local import LocalCopies, listed

BACKENDS = ("memory", "disk")
SPARE_DELAY_S = 1.0     # a store made ahead is made this long after its deployment came and after each take
OWNER = "owner"         # the file naming who took a store made ahead (its directory is spare-<id>)

logger = logging.getLogger(__name__)


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
    SPARES.drop(deployment)
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
    """A new, empty keyed state of ``backend`` (default ``pescheduler.state.backend``): on ``disk``
    the deployment's store made ahead when one is ready (:class:`Spares`), else one made now."""
    name = backend_name(backend)
    if name == "memory":
        from .memory import MemoryState

        return MemoryState()
    from .disk import DiskState

    budget = cache_bytes()                 # a bad size fails before any directory is made
    spare = SPARES.take(deployment, owner, budget)     # (a state is falsy while empty: no ``or``)
    return DiskState(store_dir(owner, deployment), budget) if spare is None else spare


class Spares:
    """An empty ``disk`` store made ahead, one per deployment on this worker, for its next store.

    Creating a RocksDB writes and syncs its first files (about ten fsyncs) while rocksdict holds
    the GIL: 5-45 ms in which nothing else of the worker runs, the more the busier its disk. A Move
    builds its PE anew inside the pause, so that creation was part of the pause (12-45 ms of Moves
    that paused 60-158 ms at 10^6 keys, traced in session 77). A worker of a ``disk`` deployment
    (:meth:`make_ahead`, called as the deployment comes) keeps one made in a thread
    :data:`SPARE_DELAY_S` later, and again that long after each :meth:`take`: the GIL it holds
    then is not a pause's. Its directory is ``spare-<id>``, with a file :data:`OWNER` naming the
    operator instance that took it. Made at the cache budget of its time: taken only at that one.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._ready: dict[str, tuple[Any, int]] = {}        # deployment -> (store, its cache budget)
        self._making: dict[str, threading.Timer] = {}       # deployment -> the timer that makes its next one

    def make_ahead(self, deployment: str, delay: float = SPARE_DELAY_S) -> None:
        """Make ``deployment``'s store ahead ``delay`` seconds from now, unless one is ready or coming."""
        with self._lock:
            if deployment in self._ready or deployment in self._making:
                return
            timer = self._making[deployment] = threading.Timer(delay, self._make, (deployment,))
            timer.name, timer.daemon = f"disk-state-spare-{deployment}"[:60], True
            timer.start()

    def _make(self, deployment: str) -> None:
        from .disk import DiskState

        me, store, budget = threading.current_thread(), None, 0
        try:
            budget = cache_bytes()
            store = DiskState(store_dir("spare", deployment), budget)
        except Exception:       # no spare: the next store is made when it is opened, as without one
            logger.warning("no store made ahead for %s", deployment, exc_info=True)
        with self._lock:
            if self._making.get(deployment) is me:       # else dropped meanwhile: the deployment ended here
                del self._making[deployment]
                if store is not None:
                    self._ready[deployment], store = (store, budget), None
            self._lock.notify_all()
        if store is not None:       # made for a deployment that ended here meanwhile: nothing of it stays
            store.close()
            for folder in (deployment_dir(deployment), machine_dir(deployment)):
                try:
                    os.rmdir(folder)
                except OSError:     # not empty: another store's, another worker's
                    break

    def take(self, deployment: str, owner: str, budget: int) -> Any:
        """``deployment``'s store made ahead, now ``owner``'s (None: none ready at this ``budget``),
        and the next one begun."""
        with self._lock:
            ready = self._ready.pop(deployment, None)
        if ready is None:
            return None
        self.make_ahead(deployment)
        store, made_at = ready
        if made_at != budget:
            store.close()
            return None
        with open(os.path.join(store.path, OWNER), "w") as f:
            f.write(_safe(owner))       # the name the store's directory would have had
        return store

    def wait(self, deployment: str, timeout: float) -> bool:
        """Until ``deployment``'s store made ahead is ready (bounded): whether it is."""
        with self._lock:
            return self._lock.wait_for(lambda: deployment in self._ready or deployment not in self._making, timeout) \
                and deployment in self._ready

    def drop(self, deployment: str) -> None:
        """The deployment ended here: its store made ahead closed and removed, its timer stopped."""
        with self._lock:
            ready, timer = self._ready.pop(deployment, None), self._making.pop(deployment, None)
            self._lock.notify_all()
        if timer is not None:
            timer.cancel()          # (one already making closes what it made: it is no longer _making's)
        if ready is not None:
            ready[0].close()


SPARES = Spares()


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

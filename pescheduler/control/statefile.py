"""Where ``status``, ``stop`` and ``list`` find embedded deployments: one small file per deployment.

An embedded cluster listens on a port chosen at start, so the deploying
process writes ``<name>.json`` (scheduler address, app, pid, start time) into
``pescheduler.state-dir``. The name is ``deploy --name N`` (:func:`use_name`),
else the app's name; two deployments running at once therefore never share a
file. A file is removed by the process that wrote it (its pid is in it); a
file whose process is gone (killed) is stale and ignored.

Two deploys started in the same second both found the other's name free,
since ``<name>.json`` is written only once the cluster is up. So the
deploying process *claims* its name and paths first, before any worker
starts: :func:`locked` holds an exclusive lock on the directory while it
compares the running records and claims with its own and writes
``<name>.claim`` (app, pid, outputs); the second deploy then sees the claim.

Example::

    statefile.use_name("nightly")            # before deploy; else the app's name
    statefile.write("tcp://127.0.0.1:40001", "connected-cars")
    statefile.read("nightly")["scheduler"]

    with statefile.locked():                 # compare and claim as one step
        statefile.claim("nightly", "connected-cars", ["/home/me/out.jsonl"])
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time

import psutil

from .. import config

_chosen: str | None = None       # deploy --name, for the deployment this process starts
_written: str | None = None      # the record this process wrote last


def use_name(name: str | None) -> None:
    """Record the next deployment of this process under ``name`` (None: under its app's name)."""
    global _chosen
    _chosen = None if name is None else checked_name(name)


def checked_name(name: str) -> str:
    """``name`` when it can name a file here; ValueError otherwise."""
    if not re.fullmatch(r"[\w.-]+", name):
        raise ValueError(f"--name {name!r}: use letters, digits, '.', '-' and '_' only")
    return name


def directory() -> str:
    return os.path.expanduser(config.get("state-dir"))


def path(name: str) -> str:
    return os.path.join(directory(), f"{name}.json")


def name_of(app_name: str) -> str:
    """The name this process's next deployment of ``app_name`` is recorded under."""
    return _chosen or re.sub(r"[^\w.-]", "_", app_name)


def write(scheduler: str, app_name: str, outputs: list[str] = (), name: str | None = None) -> None:
    """Record this process's deployment (scheduler address, app, pid, the local paths it writes)
    under ``name`` (default :func:`name_of` the app)."""
    global _written
    name = name or name_of(app_name)
    _written = path(name)
    _dump(_written, {"name": name, "scheduler": scheduler, "app": app_name, "pid": os.getpid(),
                     "started": time.time(), "outputs": list(outputs)})


@contextlib.contextmanager
def locked():
    """The state directory locked against every other deploying process on this machine
    (``flock`` on the directory itself: released when the process dies, no file left behind)."""
    os.makedirs(directory(), exist_ok=True)
    fd = os.open(directory(), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                # closing the last descriptor releases the lock


def claim(name: str, app_name: str, outputs: list[str]) -> None:
    """Claim ``name`` and ``outputs`` for this process's deployment while it starts (hold :func:`locked`
    around the comparison and this); :func:`remove` ends the claim."""
    _dump(_claim_path(name), {"name": name, "app": app_name, "pid": os.getpid(), "started": time.time(),
                              "outputs": list(outputs), "state": "starting"})


def claims() -> list[dict]:
    """Every live claim (its process still runs), a running deployment's included, oldest first."""
    return _live(".claim")


def claim_of(name: str) -> dict | None:
    """The live claim of ``name`` (its process still runs), or None."""
    state = _load(f"{name}.claim")
    return state if state is not None and _alive(state.get("pid")) else None


def remove(name: str | None = None) -> None:
    """Remove the record and claim of this process's deployment ``name`` (default: the record it wrote
    last); a file another process has taken since is left."""
    global _written
    targets = [path(name), _claim_path(name)] if name else [_written] if _written else []
    for target in targets:
        try:
            with open(target) as f:
                if json.load(f).get("pid") == os.getpid():
                    os.remove(target)
        except (OSError, ValueError):
            pass
    _written = None


def read(name: str) -> dict | None:
    """The record of the running deployment ``name``, or None (no file, or its process is gone)."""
    state = _load(f"{name}.json")
    return state if state is not None and _alive(state.get("pid")) else None


def running() -> list[dict]:
    """Every running embedded deployment's record, oldest first."""
    return _live(".json")


def _live(suffix: str) -> list[dict]:
    """The records ending in ``suffix`` whose process still runs, oldest first."""
    try:
        names = sorted(n for n in os.listdir(directory()) if n.endswith(suffix))
    except OSError:
        return []
    found = [state for state in map(_load, names) if state is not None and _alive(state.get("pid"))]
    return sorted(found, key=lambda s: s.get("started", 0))


def _load(file_name: str) -> dict | None:
    try:
        with open(os.path.join(directory(), file_name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _dump(target: str, record: dict) -> None:
    os.makedirs(directory(), exist_ok=True)
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, target)         # readers never see half a file


def _claim_path(name: str) -> str:
    return os.path.join(directory(), f"{name}.claim")


def _alive(pid) -> bool:
    return isinstance(pid, int) and psutil.pid_exists(pid)

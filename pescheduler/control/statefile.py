"""Where ``status``, ``stop`` and ``list`` find embedded deployments: one small file per deployment.

An embedded cluster listens on a port chosen at start, so the deploying
process writes ``<name>.json`` (scheduler address, app, pid, start time) into
``pescheduler.state-dir``. The name is ``deploy --name N`` (:func:`use_name`),
else the app's name; two deployments running at once therefore never share a
file. A file is removed by the process that wrote it (its pid is in it); a
file whose process is gone (killed) is stale and ignored.

Example::

    statefile.use_name("nightly")            # before deploy; else the app's name
    statefile.write("tcp://127.0.0.1:40001", "connected-cars")
    statefile.read("nightly")["scheduler"]
"""

from __future__ import annotations

import json
import os
import re
import time

import psutil

from .. import config

_chosen: str | None = None       # deploy --name, for the deployment this process starts
_written: str | None = None      # the file this process wrote


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
    os.makedirs(directory(), exist_ok=True)
    target = path(name)
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"name": name, "scheduler": scheduler, "app": app_name, "pid": os.getpid(),
                   "started": time.time(), "outputs": list(outputs)}, f)
    os.replace(tmp, target)         # readers never see half a file
    _written = target


def remove() -> None:
    """Remove the file this process wrote (if another process has taken the name since, leave it)."""
    global _written
    if _written is None:
        return
    try:
        with open(_written) as f:
            if json.load(f).get("pid") == os.getpid():
                os.remove(_written)
    except (OSError, ValueError):
        pass
    _written = None


def read(name: str) -> dict | None:
    """The record of the running deployment ``name``, or None (no file, or its process is gone)."""
    try:
        with open(path(name)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if _alive(state.get("pid")) else None


def running() -> list[dict]:
    """Every running embedded deployment's record, oldest first."""
    found = []
    try:
        names = sorted(n[:-5] for n in os.listdir(directory()) if n.endswith(".json"))
    except OSError:
        return []
    for name in names:
        state = read(name)
        if state is not None:
            found.append(state)
    return sorted(found, key=lambda s: s.get("started", 0))


def _alive(pid) -> bool:
    return isinstance(pid, int) and psutil.pid_exists(pid)

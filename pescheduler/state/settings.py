"""Which backend a KEYED operator's state lives in, and where: ``pescheduler.state.*``.

The backend is the deployment's choice (``deploy(state=)``, ``deploy --state``,
else ``pescheduler.state.backend``), carried to the operator in
``context.extra["state"]``; the directory and the cache are the worker's own
settings (``pescheduler.state.dir``, ``pescheduler.state.cache``), read where
the store opens.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from typing import Any

from dask.utils import parse_bytes

from .. import config
from .base import KeyedState

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


def store_dir(owner: str) -> str:
    """A fresh directory for one store under ``pescheduler.state.dir`` (null: the temp directory)."""
    root = os.path.expanduser(config.get("state.dir") or tempfile.gettempdir())
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", owner)[:80]
    path = os.path.join(root, "pescheduler-state", f"{safe}-{uuid.uuid4().hex[:12]}")
    os.makedirs(path)
    return path


def open_state(backend: str | None = None, owner: str = "state") -> KeyedState:
    """A new, empty keyed state of ``backend`` (default ``pescheduler.state.backend``)."""
    name = backend_name(backend)
    if name == "memory":
        from .memory import MemoryState

        return MemoryState()
    from .disk import DiskState

    budget = cache_bytes()                 # a bad size fails before any directory is made
    return DiskState(store_dir(owner), budget)


def keyed_state(context: Any, name: str = "state") -> KeyedState:
    """The keyed state of an operator being opened: its deployment's backend, a store of its own.

    Call it in ``open`` (after ``super().open(context)``) and close what it
    returns in ``close``::

        def open(self, context):
            super().open(context)
            self.state = keyed_state(context)

        def close(self):
            self.state.close()
    """
    owner = "-".join(p for p in (context.pe_id, context.op_id, f"c{context.copy_index}", name) if p)
    return open_state(context.extra.get("state"), owner)

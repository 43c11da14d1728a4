"""Keyed state partitioned by key group, in memory or on disk (docs/state.md).

``KeyedState`` is the contract (get/put/delete, iterate a key group, a
consistent snapshot, the key groups changed since it, export/import of whole
key groups); ``MemoryState`` and ``DiskState`` implement it; an operator gets
its own with :func:`keyed_state` at ``open``, or names its states in a
:class:`KeyedOperator` (``pescheduler/state/operator.py``), which snapshots,
restores and moves them by key group.
"""

from .base import KEY_GROUPS, KeyedState, StateView, key_group, pack_group, unpack_group
from .memory import MemoryState
from .settings import BACKENDS, adopt, backend_name, keyed_state, open_state
from .operator import KeyedOperator

__all__ = ["BACKENDS", "KEY_GROUPS", "KeyedOperator", "KeyedState", "MemoryState", "StateView", "adopt", "backend_name",
           "key_group", "keyed_state", "open_state", "pack_group", "unpack_group"]


def __getattr__(name: str):
    if name == "DiskState":                  # rocksdict is imported only when the disk backend is used
        from .disk import DiskState

        return DiskState
    raise AttributeError(name)

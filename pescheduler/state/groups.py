"""What a KEYED operator's snapshot holds of its keyed state: whole key groups.

``{group: (a key of it, bytes)}``: the bytes are :func:`pack_group`'s, the key
stands for its group when a rescale asks ``owns(key)`` (copies own whole key
groups, so one key answers for all of them). Splitting and merging snapshots
then select and join key groups; no key is visited.
"""

from __future__ import annotations

from typing import Any, Callable

from .base import KeyedState, pack_group

Groups = dict[int, tuple[Any, bytes]]


def snapshot_groups(state: KeyedState) -> Groups:
    """Every non-empty key group of ``state`` as it is now."""
    view = state.snapshot()
    try:
        out = {}
        for g in view.groups():
            entries = dict(view.items(g))
            out[g] = (next(iter(entries)), pack_group(entries.items()))
        return out
    finally:
        view.release()


def restore_groups(state: KeyedState, groups: Groups) -> None:
    """Install a snapshot's key groups into ``state``."""
    state.import_groups({g: data for g, (_key, data) in groups.items()})


def split_groups(groups: Groups, owns: Callable[[Any], bool]) -> Groups:
    """The key groups whose keys ``owns``."""
    return {g: kd for g, kd in groups.items() if owns(kd[0])}


def merge_groups(parts: list[Groups]) -> Groups:
    """Every part's key groups (parts own disjoint groups)."""
    out: Groups = {}
    for part in parts:
        out.update(part)
    return out


def adopt(context: Any, held: KeyedState) -> KeyedState:
    """The operator's state in its deployment's backend (``keyed_state``), holding what ``held``
    holds: an operator keeps a ``MemoryState`` until ``open`` because ``restore`` comes first."""
    from .settings import backend_name, keyed_state

    if backend_name(context.extra.get("state")) == held.backend:
        return held
    chosen = keyed_state(context)
    chosen.import_groups(held.export_groups())
    held.close()
    return chosen

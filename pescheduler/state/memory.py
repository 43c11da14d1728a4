"""The ``memory`` backend: one dict per key group, copy-on-write at snapshots.

A snapshot costs O(key groups): the view keeps references to the group dicts
of that moment and the state copies a group (a shallow dict copy) only at its
first write after the snapshot. A stall at a checkpoint is then the copy of the
groups written next, not of the whole state. ``writable()`` hands a keyed
operator the keys put since the snapshot, so its hot path changes those in
place with no call per tuple.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from .base import KEY_GROUPS, KeyedState, StateView, key_group
from .groups import GroupMemo


class MemoryView(StateView):
    """The group dicts as they were at the snapshot (shared with the state until it writes them)."""

    def __init__(self, tables: list[dict]) -> None:
        self._tables = tables

    def groups(self) -> list[int]:
        return [g for g, t in enumerate(self._tables) if t]

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        return iter(self._tables[group].items())


class MemoryState(KeyedState):
    """Plain dicts per key group; see the module docstring."""

    backend = "memory"

    def __init__(self) -> None:
        self._tables: list[dict] = [{} for _ in range(KEY_GROUPS)]
        self._shared: set[int] = set()      # groups a live view still reads: copy before writing
        self._changed: set[int] = set()
        self._written: dict = {}            # key -> value put since the snapshot (see writable)
        # A keyed operator asks for a key's group once per tuple: remembered, not recomputed.
        # Holds the keys held or asked for (a key deleted or moved away is forgotten).
        self._group = GroupMemo()
        self._of = self._group._of

    # get and put are a keyed operator's per-tuple calls: the memo and the copy-on-write check
    # are inline (a method call for each made a count window's hot path 1.8x slower).
    def get(self, key: Any, default: Any = None) -> Any:
        g = self._of.get(key)
        if g is None:
            g = self._of[key] = key_group(key)
        return self._tables[g].get(key, default)

    def put(self, key: Any, value: Any) -> None:
        g = self._of.get(key)
        if g is None:
            g = self._of[key] = key_group(key)
        if g in self._shared:
            self._unshare(g)
        self._changed.add(g)
        self._tables[g][key] = value
        self._written[key] = value

    def delete(self, key: Any) -> None:
        g = self._group(key)
        if g in self._shared:
            self._unshare(g)
        self._changed.add(g)
        self._tables[g].pop(key, None)
        self._written.pop(key, None)
        self._group.forget(key)

    def _unshare(self, g: int) -> None:
        """Copy group ``g`` at its first write after a snapshot (the view keeps the old dict)."""
        self._shared.discard(g)
        self._tables[g] = dict(self._tables[g])

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        return iter(self._tables[group].items())

    def groups(self) -> list[int]:
        return [g for g, t in enumerate(self._tables) if t]

    def snapshot(self) -> MemoryView:
        self._shared = set(range(KEY_GROUPS))
        self._changed = set()
        self._written.clear()               # cleared in place: nobody may hold it past a snapshot
        return MemoryView(list(self._tables))

    def writable(self) -> dict:
        return self._written

    def changed(self) -> set[int]:
        return set(self._changed)

    def drop_groups(self, groups: Iterable[int]) -> None:
        for g in groups:
            self._put_group(g, {})

    def take_groups(self, groups: Iterable[int]) -> dict[int, dict]:
        """The group dicts themselves, replaced by empty ones: O(groups) plus forgetting their
        keys, no copy (a view still reading one only reads it)."""
        taken = {}
        for g in sorted(groups):
            if self._tables[g]:
                taken[g] = self._tables[g]
                self._put_group(g, {})
        return taken

    def _put_group(self, group: int, entries: dict) -> None:
        for key in self._tables[group]:
            self._group.forget(key)
            self._written.pop(key, None)
        self._tables[group] = dict(entries)
        self._shared.discard(group)
        self._changed.add(group)

    def __len__(self) -> int:
        return sum(map(len, self._tables))

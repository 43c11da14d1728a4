"""The ``memory`` backend: one dict per key group, copy-on-write at snapshots.

A snapshot costs O(key groups): the view keeps references to the group dicts
of that moment and the state copies a group (a shallow dict copy) only at its
first write after the snapshot. A stall at a checkpoint is then the copy of the
groups written next, not of the whole state.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from .base import KEY_GROUPS, KeyedState, StateView
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
        # The hot path of a keyed operator asks once per tuple: remembered, not recomputed. Holds
        # the keys held or asked for (a key deleted or moved away is forgotten).
        self._group = GroupMemo()

    def _writable(self, key: Any) -> dict:
        g = self._group(key)
        self._changed.add(g)
        if g in self._shared:
            self._shared.discard(g)
            self._tables[g] = dict(self._tables[g])
        return self._tables[g]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._tables[self._group(key)].get(key, default)

    def put(self, key: Any, value: Any) -> None:
        self._writable(key)[key] = value

    def delete(self, key: Any) -> None:
        self._writable(key).pop(key, None)
        self._group.forget(key)

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        return iter(self._tables[group].items())

    def groups(self) -> list[int]:
        return [g for g, t in enumerate(self._tables) if t]

    def snapshot(self) -> MemoryView:
        self._shared = set(range(KEY_GROUPS))
        self._changed = set()
        return MemoryView(list(self._tables))

    def changed(self) -> set[int]:
        return set(self._changed)

    def drop_groups(self, groups: Iterable[int]) -> None:
        for g in groups:
            self._put_group(g, {})

    def _put_group(self, group: int, entries: dict) -> None:
        for key in self._tables[group]:
            self._group.forget(key)
        self._tables[group] = dict(entries)
        self._shared.discard(group)
        self._changed.add(group)

    def __len__(self) -> int:
        return sum(map(len, self._tables))

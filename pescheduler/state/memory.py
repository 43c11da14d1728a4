"""The ``memory`` backend: one dict per key group, copy-on-write at snapshots.

A snapshot costs O(key groups): the view keeps references to the group dicts
of that moment and the state copies a group (a shallow dict copy) only at its
first write after the snapshot. A stall at a checkpoint is then the copy of the
groups written next, not of the whole state. ``writable()`` hands a keyed
operator the keys put since the snapshot, so its hot path changes those in
place with no call per tuple.

A view is read while the stream goes on (a checkpoint's files are written
from it in another thread), so the values it shares must not change in
place: while a view lives, :meth:`MemoryState.get` hands out a copy of a
value not put since the snapshot (the operator changes the copy and puts it
back, as the contract asks). Once every view is released, ``get`` is a plain
lookup again.
"""

from __future__ import annotations

import pickle
import weakref
from typing import Any, Iterable, Iterator

from .base import KEY_GROUPS, Changes, KeyedState, StateView, key_group
from .groups import GroupMemo

_PICKLE = pickle.HIGHEST_PROTOCOL


def _copy(value: Any) -> Any:
    """A deep copy for the values a view shares (a pickle round trip: faster than ``deepcopy``)."""
    return pickle.loads(pickle.dumps(value, _PICKLE))


class MemoryView(StateView):
    """The group dicts as they were at the snapshot (shared with the state until it writes them)."""

    def __init__(self, tables: list[dict], changes: Changes | None = None, live: set | None = None) -> None:
        self._tables = tables
        self.changes = changes
        if live is not None:                # the state copies shared values while this view lives
            live.add(id(self))
            self._end = weakref.finalize(self, live.discard, id(self))

    def groups(self) -> list[int]:
        return [g for g, t in enumerate(self._tables) if t]

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        return iter(self._tables[group].items())

    def by_group(self, keys: Iterable[Any]) -> dict[int, list]:
        out: dict[int, list] = {}
        for key in keys:
            out.setdefault(key_group(key), []).append(key)
        return out

    def delta(self, group: int, keys: Iterable[Any]) -> tuple[dict, list]:
        table = self._tables[group]
        puts = {k: table[k] for k in keys if k in table}
        return puts, [k for k in keys if k not in table]

    def release(self) -> None:
        end = getattr(self, "_end", None)
        if end is not None:
            end()


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
        self._deleted: set = set()          # keys deleted since the snapshot (Changes.keys with _written)
        self._whole: set[int] = set()       # groups replaced whole since the snapshot
        self._live: set[int] = set()        # ids of the views not yet released (see the module docstring)
        self._track()

    # get and put are a keyed operator's per-tuple calls: the memo and the copy-on-write check
    # are inline (a method call for each made a count window's hot path 1.8x slower).
    def get(self, key: Any, default: Any = None) -> Any:
        g = self._of.get(key)
        if g is None:
            g = self._of[key] = key_group(key)
        value = self._tables[g].get(key, default)
        if self._live and value is not default and key not in self._written:
            return _copy(value)             # a live view may be reading this object
        return value

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
        self._deleted.add(key)
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
        """O(key groups + keys written since the last one): the changed keys are the next
        incremental checkpoint's input."""
        changes = self._changes(set(self._written) | self._deleted, self._whole)
        self._deleted, self._whole = set(), set()
        self._shared = set(range(KEY_GROUPS))
        self._changed = set()
        self._written.clear()               # cleared in place: nobody may hold it past a snapshot
        return MemoryView(list(self._tables), changes, self._live)

    def writable(self) -> dict:
        return self._written

    def changed(self) -> set[int]:
        return set(self._changed)

    def drop_groups(self, groups: Iterable[int]) -> None:
        for g in groups:
            self._put_group(g, {})

    def take_groups(self, groups: Iterable[int]) -> dict[int, dict]:
        """The group dicts themselves, replaced by empty ones, no copy (a view still reading one
        only reads it): O(groups) plus the keys put since the snapshot, in a rescale's turn.
        Their keys' memoized groups stay (still right) until the memo is pruned: forgetting
        them one by one was 0.7 s of the turn for half of 10^6 keys."""
        taken, written = {}, self._written
        for g in sorted(groups):
            table = self._tables[g]
            if not table:
                continue
            taken[g] = table
            if written:
                for key in ([k for k in written if k in table] if len(written) < len(table) else table):
                    written.pop(key, None)
            self._tables[g] = {}
            self._shared.discard(g)
            self._changed.add(g)
            self._whole.add(g)
        self._group.prune(sum(map(len, self._tables)))
        return taken

    def _put_group(self, group: int, entries: dict) -> None:
        for key in self._tables[group]:
            self._group.forget(key)
            self._written.pop(key, None)
        self._tables[group] = dict(entries)
        self._shared.discard(group)
        self._changed.add(group)
        self._whole.add(group)

    def __len__(self) -> int:
        return sum(map(len, self._tables))

"""The ``memory`` backend: one flat dict of every key, folded into key groups only when asked.

A keyed operator touches a key with a get and a put per tuple; what it needs of
key groups (a snapshot, a rescale's take, an import) comes once per checkpoint
or reconfiguration. So the primary store is one ``{key: value}`` index and a
get or put is about one dict operation, as with an operator's own dict:

- ``get`` *is* the index's ``dict.get`` while no snapshot view is live (the
  common case: a view lives only while a checkpoint's files are written);
- ``put`` and ``delete`` write the index and note the key as written since the
  snapshot (``writable()``) and since the last fold, nothing else.

The per-group dicts are brought up to date ("folded") only when someone needs
groups (:meth:`MemoryState.snapshot`, ``groups``, ``items``, ``take_groups``,
``import_groups``, ``changed``): the keys written since the last fold are
put into their groups' dicts, their key groups computed in one batch
(``groups.key_groups``). A snapshot therefore costs O(keys
written since the last one), never O(all keys).

Copy-on-write: the view keeps references to the group dicts of the snapshot;
a fold copies a group a live view still shares (a shallow dict copy) before
writing it. A view is read while the stream goes on (a checkpoint's files are
written from it in another thread), so the values it shares must not change
in place: while a view lives, ``get`` hands out a copy of a value not put
since the snapshot (the operator changes the copy and puts it back, as the
contract asks). Once every view is released, ``get`` is the plain lookup again.
"""

from __future__ import annotations

import pickle
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator

from .base import KEY_GROUPS, Changes, KeyedState, StateView
from .groups import key_groups

_PICKLE = pickle.HIGHEST_PROTOCOL
_NOTHING = object()
# Who installs ``MemoryState.get`` (the snapshot that makes a view live, the release of the last
# one, maybe in a checkpoint's thread) decides under this lock, so a release cannot put the plain
# lookup back over a view that a snapshot made live in between. Never taken on a get or a put.
# Reentrant: a view collected by the garbage collector inside _bind releases itself there (it only
# ever empties the live views, so the outer decision stays safe: at worst the copying get).
_BIND = threading.RLock()


def _copy(value: Any) -> Any:
    """A deep copy for the values a view shares (a pickle round trip: faster than ``deepcopy``)."""
    return pickle.loads(pickle.dumps(value, _PICKLE))


class MemoryView(StateView):
    """The group dicts as they were at the snapshot (shared with the state until it writes them)."""

    def __init__(self, tables: list[dict], changes: Changes | None = None, live: set | None = None,
                 on_release: Callable[[int], None] | None = None) -> None:
        self._tables = tables
        self.changes = changes
        if live is not None:                # the state copies shared values while this view lives
            live.add(id(self))
            self._end = weakref.finalize(self, on_release or live.discard, id(self))

    def groups(self) -> list[int]:
        return [g for g, t in enumerate(self._tables) if t]

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        return iter(self._tables[group].items())

    def by_group(self, keys: Iterable[Any]) -> dict[int, list]:
        keys = list(keys)
        out: dict[int, list] = {}
        for key, g in zip(keys, key_groups(keys)):
            out.setdefault(g, []).append(key)
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
    """A flat index of every key, key groups folded on demand; see the module docstring."""

    backend = "memory"

    def __init__(self) -> None:
        self._index: dict = {}              # key -> value: the state as it is now
        self._tables: list[dict] = [{} for _ in range(KEY_GROUPS)]   # by group, as of the last fold
        self._unfolded: dict = {}           # key -> value put since the last fold
        self._unfolded_gone: set = set()    # keys deleted since the last fold
        self._shared: set[int] = set()      # groups a live view still reads: copy before writing
        self._changed: set[int] = set()     # groups written since the snapshot, as of the last fold
        self._written: dict = {}            # key -> value put since the snapshot (see writable)
        self._deleted: set = set()          # keys deleted since the snapshot (Changes.keys with _written)
        self._whole: set[int] = set()       # groups replaced whole since the snapshot
        self._live: set[int] = set()        # ids of the views not yet released (see the module docstring)
        self._bind()
        self._track()

    # -- the per-tuple calls: about one dict operation each -------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        """While no view is live this method is shadowed by the index's own ``dict.get``
        (:meth:`_bind`); this body runs while one is, and copies what the view may be reading."""
        value = self._index.get(key, default)
        if self._live and value is not default and key not in self._written:
            return _copy(value)             # a live view may be reading this object
        return value

    def put(self, key: Any, value: Any) -> None:
        self._index[key] = value
        self._written[key] = value
        self._unfolded[key] = value

    def delete(self, key: Any) -> None:
        self._index.pop(key, None)
        self._written.pop(key, None)
        self._deleted.add(key)
        self._unfolded.pop(key, None)
        self._unfolded_gone.add(key)

    def read(self, key: Any, default: Any = None) -> Any:
        return self._index.get(key, default)

    def get_many(self, keys: list) -> list:
        get = self.get
        return [get(k) for k in keys]

    def write_many(self, puts: Iterable[tuple[Any, Any]] | dict, deletes: Iterable[Any] = ()) -> None:
        """Three dict updates in C: an operator that gathers a batch's writes in a dict (one
        store per tuple) and writes them here once pays no Python call per key (a ``put`` is
        one, with three stores)."""
        if type(puts) is not dict:
            puts = dict(puts)
        self._index.update(puts)
        self._written.update(puts)
        self._unfolded.update(puts)
        if deletes:
            self.delete_many(deletes)

    def delete_many(self, keys: Iterable[Any]) -> None:
        index, written, deleted = self._index, self._written, self._deleted
        unfolded, unfolded_gone = self._unfolded, self._unfolded_gone
        for key in keys:
            index.pop(key, None)
            written.pop(key, None)
            deleted.add(key)
            unfolded.pop(key, None)
            unfolded_gone.add(key)

    def entries(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._index.items())

    def writable(self) -> dict:
        return self._written

    def __len__(self) -> int:
        return len(self._index)

    # -- views: the lookup that copies while one is live -----------------------------------------
    def _bind(self) -> None:
        """``get`` is the index's ``dict.get`` while no view is live, else the copying method."""
        with _BIND:
            if self._live:
                self.__dict__.pop("get", None)
            else:
                self.get = self._index.get

    def _released(self, view_id: int) -> None:
        self._live.discard(view_id)
        if not self._live:
            self._bind()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("get", None)              # a bound lookup of the old index: bound again on load
        state["_live"] = set()              # views are not pickled with the state
        state["_shared"] = set()
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._bind()

    # -- key groups: folded from the writes when asked --------------------------------------------
    def _fold(self) -> None:
        """Bring the group dicts up to date with the index: O(keys written since the last fold),
        their groups computed in one batch. A group a live view shares is copied first; once no
        view lives, none is. Only what came since the last fold: an operator that writes after
        each group it reads (a sweep) folds once per group, and a fold of every key written since
        the snapshot made that sweep cost groups x keys written (ep_patterns ran 0.3x its dict)."""
        unfolded, unfolded_gone = self._unfolded, self._unfolded_gone
        if not unfolded and not unfolded_gone:
            return
        if not self._live:
            self._shared.clear()
        tables, index = self._tables, self._index
        gone = [k for k in unfolded_gone if k not in index]     # not put again (or imported) since
        # Computed at each fold, not remembered: a batch costs less per key than a memo's
        # check, insert and lookup did (measured at 10^5 keys), and holds no memory between folds.
        put_in = key_groups(list(unfolded))
        taken_from = key_groups(gone)
        touched = set(put_in).union(taken_from)
        for g in touched & self._shared:
            self._unshare(g)
        self._changed |= touched
        # Hot loop: one dict store per key written (the groups were looked up in one pass above).
        for g, key, value in zip(put_in, unfolded, unfolded.values()):
            tables[g][key] = value
        for g, key in zip(taken_from, gone):
            tables[g].pop(key, None)
        self._unfolded, self._unfolded_gone = {}, set()

    def _unshare(self, g: int) -> None:
        """Copy group ``g`` at its first write after a snapshot (the view keeps the old dict)."""
        self._shared.discard(g)
        self._tables[g] = dict(self._tables[g])

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        self._fold()
        return iter(self._tables[group].items())

    def groups(self) -> list[int]:
        self._fold()
        return [g for g, t in enumerate(self._tables) if t]

    def snapshot(self) -> MemoryView:
        """O(key groups + keys written since the last one): the changed keys are the next
        incremental checkpoint's input."""
        self._fold()
        changes = self._changes(set(self._written) | self._deleted, self._whole)
        self._deleted, self._whole = set(), set()
        self._shared = set(range(KEY_GROUPS))
        self._changed = set()
        self._written.clear()               # cleared in place: nobody may hold it past a snapshot
        view = MemoryView(list(self._tables), changes, self._live, self._released)
        self._bind()
        return view

    def changed(self) -> set[int]:
        self._fold()
        return set(self._changed)

    def drop_groups(self, groups: Iterable[int]) -> None:
        for g in groups:
            self._put_group(g, {})

    def take_groups(self, groups: Iterable[int]) -> dict[int, dict]:
        """The group dicts themselves, replaced by empty ones, no copy (a view still reading one
        only reads it): O(groups + their keys) (each leaves the index) in a rescale's turn."""
        self._fold()
        taken, index, written = {}, self._index, self._written
        for g in sorted(groups):
            table = self._tables[g]
            if not table:
                continue
            taken[g] = table
            for key in table:
                del index[key]
            if written:
                for key in ([k for k in written if k in table] if len(written) < len(table) else table):
                    written.pop(key, None)
            self._tables[g] = {}
            self._shared.discard(g)
            self._changed.add(g)
            self._whole.add(g)
        return taken

    def _put_group(self, group: int, entries: dict) -> None:
        self._fold()
        index, written = self._index, self._written
        for key in self._tables[group]:
            del index[key]
            written.pop(key, None)
        self._tables[group] = dict(entries)
        index.update(entries)
        self._shared.discard(group)
        self._changed.add(group)
        self._whole.add(group)

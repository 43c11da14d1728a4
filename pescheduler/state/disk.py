"""The ``disk`` backend: an embedded RocksDB (through ``rocksdict``) per operator instance.

Layout: one store per operator instance in a directory of its own under
``pescheduler.state.dir``; a key is stored as one byte of key group followed
by its pickle, a value as its pickle. A key group is therefore one contiguous
key range: iterating, exporting or dropping a group is a seek and a range
(``delete_range``), never a scan of the others.

Memory is bounded by ``pescheduler.state.cache``: half of it is RocksDB's block
cache (recently read blocks), the other half its memtables (recent writes,
charged to the same budget by a write buffer manager). What does not fit is in
SST files on the worker's disk, so an instance may hold several times the
worker's memory. A snapshot is a RocksDB checkpoint (the memtable flushed, then
the SST files hard-linked into a directory beside the store's, inside the
instance's directory: O(files), not
O(keys)) opened read-only; those immutable files are what an incremental
checkpoint will upload next (rocksdict's ``Snapshot`` would be O(1), but its
iterators read the live store, not the snapshot, in 0.3.29).

Why RocksDB through rocksdict: a maintained binding shipping wheels with the
store built in (no system library), with snapshots, range deletes, a bounded
block cache and checkpoints (hard-linked SST files: where incremental
checkpoints plug in). Measured against plain dicts in bench/state.py.
"""

from __future__ import annotations

import itertools
import os
import pickle
import shutil
import weakref
from typing import Any, Iterable, Iterator

from .base import Changes, KeyedState, StateView, key_group

_PICKLE = pickle.HIGHEST_PROTOCOL


def _prefix(group: int) -> bytes:
    return bytes((group,))


def _encode(key: Any) -> bytes:
    return _prefix(key_group(key)) + pickle.dumps(key, _PICKLE)


def _range(source: Any, group: int) -> Iterator[tuple[Any, Any]]:
    """``(key, value)`` of one group from a store or a store snapshot (one seek, then in order)."""
    it = source.iter()
    it.seek(_prefix(group))
    while it.valid():
        raw = it.key()
        if raw[0] != group:
            break
        yield pickle.loads(raw[1:]), pickle.loads(it.value())
        it.next()


def _groups(source: Any) -> list[int]:
    """Non-empty key groups: a seek per group found (the store is ordered by group)."""
    found, it = [], source.iter()
    it.seek_to_first()
    while it.valid():
        g = it.key()[0]
        found.append(g)
        it.seek(_prefix(g + 1))             # groups are < 128: g + 1 is still one byte
    return found


def _shut(db: Any, path: str) -> None:
    """Close a store (or a view's) and remove its directory."""
    db.close()
    shutil.rmtree(path, ignore_errors=True)


class DiskView(StateView):
    """A RocksDB checkpoint of the store, opened read-only: the store as it was, while writes go on."""

    def __init__(self, db: Any, path: str, changes: Changes | None = None) -> None:
        from rocksdict import AccessType, Checkpoint, Options, Rdict

        Checkpoint(db).create_checkpoint(path)
        self.path = path
        self.changes = changes
        self._snap = Rdict(path, Options(raw_mode=True), access_type=AccessType.read_only())
        self._end = weakref.finalize(self, _shut, self._snap, path)

    def groups(self) -> list[int]:
        return _groups(self._snap)

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        return _range(self._snap, group)

    def by_group(self, keys: Iterable[bytes]) -> dict[int, list]:
        out: dict[int, list] = {}
        for raw in keys:                    # encoded keys: their first byte is their group
            out.setdefault(raw[0], []).append(raw)
        return out

    def delta(self, group: int, keys: Iterable[bytes]) -> tuple[dict, list]:
        puts, deletes, loads = {}, [], pickle.loads
        for raw in keys:
            value = self._snap.get(raw)
            if value is None:
                deletes.append(loads(raw[1:]))
            else:
                puts[loads(raw[1:])] = loads(value)
        return puts, deletes

    def release(self) -> None:
        self._end()
        self._snap = None


_GONE = object()        # a key deleted after a settle()'s view
SETTLE_KEYS = 100_000   # keys written after a settle() that the take still reads again


class ViewGroup:
    """One key group of a view, read when iterated (a group taken by :meth:`DiskState.take_groups`:
    its keys and values, as ``{key: value}`` would give them; the view lives as long as this).
    ``newer``: keys written after the view was taken, with their value at the take."""

    def __init__(self, view: DiskView, group: int, newer: dict | None = None) -> None:
        self.view, self.group, self.newer = view, group, newer or {}

    def __iter__(self) -> Iterator[Any]:
        return (key for key, _value in self.items())

    def items(self) -> Iterator[tuple[Any, Any]]:
        newer = self.newer
        for key, value in self.view.items(self.group):
            if key not in newer:
                yield key, value
        for key, value in newer.items():
            if value is not _GONE:
                yield key, value


class DiskState(KeyedState):
    """RocksDB in ``path`` with ``cache_bytes`` of memory; see the module docstring.

    ``path`` is this instance's own directory: the store in ``path/db``, views beside it. It
    is the operator's working set (durable copies are the checkpoint's), removed by
    :meth:`close` or, at the latest, when the state is garbage-collected or its process exits.
    """

    backend = "disk"

    def __init__(self, path: str, cache_bytes: int) -> None:
        from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBufferManager

        cache = Cache(max(cache_bytes // 2, 1 << 20))
        table = BlockBasedOptions()
        table.set_block_cache(cache)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_manager(WriteBufferManager.new_write_buffer_manager_with_cache(
            max(cache_bytes // 2, 1 << 20), False, cache))
        opts.set_write_buffer_size(max(cache_bytes // 8, 1 << 20))
        self.path = path
        self._db = Rdict(os.path.join(path, "db"), opts)
        self._end = weakref.finalize(self, _shut, self._db, path)
        self._changed: set[int] = set()
        self._dirty: set[bytes] = set()     # encoded keys put or deleted since the snapshot
        self._whole: set[int] = set()       # groups replaced whole since the snapshot
        self._views: list[DiskView] = []
        self._ready: DiskView | None = None     # a view taken by settle() for the coming take_groups
        self._since: set[bytes] | None = None   # keys written since that view began
        self._view_ids = itertools.count()
        self._track()

    def get(self, key: Any, default: Any = None) -> Any:
        raw = self._db.get(_encode(key))
        return default if raw is None else pickle.loads(raw)

    def put(self, key: Any, value: Any) -> None:
        k = _encode(key)
        self._changed.add(k[0])
        self._dirty.add(k)
        if self._since is not None:
            self._written_since(k)
        self._db.put(k, pickle.dumps(value, _PICKLE))

    def delete(self, key: Any) -> None:
        k = _encode(key)
        self._changed.add(k[0])
        self._dirty.add(k)
        if self._since is not None:
            self._written_since(k)
        self._db.delete(k)

    def get_many(self, keys: list) -> list:
        """One multi-get (a get per key through the binding cost a call and a lookup each)."""
        loads = pickle.loads
        return [None if raw is None else loads(raw) for raw in self._db.get([_encode(k) for k in keys])]

    def write_many(self, puts: Iterable[tuple[Any, Any]], deletes: Iterable[Any] = ()) -> None:
        """One write batch for all of them."""
        from rocksdict import WriteBatch

        batch, dumps, changed, dirty = WriteBatch(raw_mode=True), pickle.dumps, self._changed, self._dirty
        written = []
        for key, value in puts:
            k = _encode(key)
            written.append(k)
            batch.put(k, dumps(value, _PICKLE))
        for key in deletes:
            k = _encode(key)
            written.append(k)
            batch.delete(k)
        changed.update(k[0] for k in written)
        dirty.update(written)
        if self._since is not None:         # read again by a coming take, as put and delete are
            for k in written:
                self._written_since(k)
                if self._since is None:
                    break
        self._db.write(batch)

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        return _range(self._db, group)

    def groups(self) -> list[int]:
        return _groups(self._db)

    def snapshot(self) -> DiskView:
        changes = self._changes(self._dirty, self._whole)
        self._changed, self._dirty, self._whole = set(), set(), set()
        self._views = [v for v in self._views if v._snap is not None]
        view = DiskView(self._db, os.path.join(self.path, f"view-{next(self._view_ids)}"), changes)
        self._views.append(view)
        return view

    def changed(self) -> set[int]:
        return set(self._changed)

    def drop_groups(self, groups: Iterable[int]) -> None:
        for g in groups:
            self._db.delete_range(_prefix(g), _prefix(g + 1))
            self._changed.add(g)
            self._whole.add(g)

    def take_groups(self, groups: Iterable[int]) -> dict[int, "ViewGroup"]:
        """Whole key groups out of the store without reading them here (a rescale's export, in
        the PE's turn): a view (a RocksDB checkpoint: the memtable flushed, files hard-linked)
        keeps them, read only when the part is packed, off the turn; the store drops them by
        range. The view :meth:`settle` took in another thread is used, with the few keys
        written since read now; without one, the view is taken here."""
        view, since = self._ready, self._since
        self._ready = self._since = None
        chosen = sorted(set(groups) & set(self.groups()) | {k[0] for k in since or ()} & set(groups))
        if not chosen:
            return {}
        if view is None:
            view, since = self._view(), set()
        newer: dict[int, dict] = {}         # group -> key -> value now (_GONE: deleted since)
        for raw in since:
            if raw[0] in chosen:
                value = self._db.get(raw)
                newer.setdefault(raw[0], {})[pickle.loads(raw[1:])] = _GONE if value is None else pickle.loads(value)
        self.drop_groups(chosen)
        return {g: ViewGroup(view, g, newer.get(g)) for g in chosen}

    def _view(self) -> DiskView:
        return DiskView(self._db, os.path.join(self.path, f"view-{next(self._view_ids)}"))


    def _put_group(self, group: int, entries: dict) -> None:
        """One write batch per group (a put per key through the binding was the cost of a restore)."""
        from rocksdict import WriteBatch

        first = next(iter(entries), None)     # one key checked: a group's keys come whole from export
        if first is not None and key_group(first) != group:
            raise ValueError(f"key {first!r} is in key group {key_group(first)}, not {group}")
        prefix, batch, dumps = _prefix(group), WriteBatch(raw_mode=True), pickle.dumps
        batch.delete_range(prefix, _prefix(group + 1))
        for key, value in entries.items():
            batch.put(prefix + dumps(key, _PICKLE), dumps(value, _PICKLE))
        self._db.write(batch)
        self._changed.add(group)
        self._whole.add(group)

    def settle(self) -> None:
        """The view for the coming :meth:`take_groups`, taken here (another thread: RocksDB is
        safe to flush and checkpoint while the PE writes); keys written from now on are read
        again at the take. Tracking stops past ``SETTLE_KEYS`` keys (the take then takes its
        own view): a settle whose take never came must not grow for good."""
        self._since = set()
        self._ready = self._view()

    def _written_since(self, raw: bytes) -> None:
        since = self._since
        since.add(raw)
        if len(since) > SETTLE_KEYS:
            self._ready = self._since = None

    def close(self) -> None:
        """Close the store and remove its directory (views taken from it end first)."""
        for view in self._views:
            view.release()
        self._views = []
        self._end()

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
groups (:meth:`MemoryState.snapshot`, ``groups``, ``items``,
``import_groups``, ``changed``; a rescale's take folds nothing,
below): the keys written since the last fold are
put into their groups' dicts, their key groups computed in one batch
(``groups.key_groups``). A snapshot therefore costs O(keys
written since the last one), never O(all keys).

At a snapshot even that fold leaves the PE's loop (:class:`_Fold`): the keys
written since the last fold are handed to the view as they are (their dicts
swapped for new ones, O(1)), and whoever needs the group dicts first applies
them, once: the checkpoint's writer, in the worker's thread, or the state's
next fold. So the stall at a barrier does not grow with the keys written
since the last one (1 % of 10^7 keys is 10^5 of them). The view then reads the
group dicts with those writes applied in place, which no one else may read
meanwhile: only a snapshot taken while no earlier view is live defers its
fold (else it folds at once, as before).

Copy-on-write: the view keeps references to the group dicts of the snapshot;
a fold copies a group a live view still shares (a shallow dict copy) before
writing it. A view is read while the stream goes on (a checkpoint's files are
written from it in another thread), so the values it shares must not change
in place: while a view lives, ``get`` hands out a copy of a value not put
since the snapshot (the operator changes the copy and puts it back, as the
contract asks). Once every view is released, ``get`` is the plain lookup again.

A rescale's take (:meth:`MemoryState.take_groups`, in the PE's turn) hands the
group dicts over without a fold, without sorting out the writes since the last
fold and without removing their keys from the index: each grew with the state
(at 10^6 keys, 240-580 ms copying the groups a view shared, 465 ms deleting the
taken keys, 116-1,330 ms sorting the 345,458 keys written since the last
checkpoint after a fill). The writes since the last fold are set aside whole as
a *layer* (a :class:`_Fold` without tables, in ``_layers``): the state's next
fold, or the next snapshot's deferred fold, applies it to the groups that stay
(its ``done``: the groups taken), and each taken group reads its own part of
it. The keys leave the index later, in the process's leave thread. So a key
group's dict is in one of these states (a group can be unfolded and pending at
once; the index holds every key the state holds, and a taken group's keys
until they have left):

                 put, delete                  snapshot, no view live
    folded ───────────────────> unfolded ─────────────────────────> pending
      ^                            │    (in _unfolded,               │  (in the view's _Fold)
      │                            │     or a layer)                 │
      ├─── fold (a snapshot while ─┘                                 │
      │    a view lives folds too)                                   │
      └─── the view's reader (the writer thread), the state's fold ──┘

    folded / unfolded / pending ──take──> taken ──queued──> leaving ──slices──> left
                                    (out of _tables)       (_leaving)   (out of the index)

- *shared*, beside any of the first three: a live view reads the same dict.
  A fold copies it before writing it (``_unshare``); a take hands it over as
  it is (:class:`TakenGroup`: copied when first read, off the turn).
- *unfolded*: some of the group's writes are in ``_unfolded``, or in a layer a
  take set aside (older than ``_unfolded``; applied first, but for its
  ``done`` groups, whose part goes with their :class:`TakenGroup`).
- *pending*: some of the group's writes from before the snapshot are still in
  the snapshot's deferred fold (with the layers it took over). Whoever comes
  first applies them in place, under the fold's lock: the view's reader (the
  checkpoint's writer thread), the state's next fold, or the first reader of a
  taken group (the packer or the leave thread, off the turn). The fold writes
  a taken group's dict in place then: the view reads that dict too.
- *taken*: the dict left ``_tables`` (an empty one took its place) for the
  rescale, as a :class:`TakenGroup`: the dict, the deferred fold, the layers.
  Its first reader applies the deferred fold, then copies the dict and puts
  the group's part of each layer on top. Nothing writes the dict after that:
  not the state (it writes the new dict), not a later fold (the layers skip
  the group). So the leave thread and the packer read the copy without a
  lock. ``writable()`` is a new dict from the take on (the old one stays
  among the snapshot's changed keys, ``_written_before``), so no value the
  take gave away is changed in place there. The group is *vacant* from then
  on: an import of it back looks only at the writes since (normally none),
  never folds (:meth:`MemoryState._written_since_vacant`).
- *leaving*: its keys are still in the index until the leave thread removes
  them, :data:`LEAVE_KEYS` a slice (``_slices``). Meanwhile a call naming a
  key of the group, an import of the group, a pickle of the state, lets the
  whole group go at once in the caller's thread (``_leave_one``). Each slice
  checks, under the leave lock, that its group is still the one leaving, so
  it never removes keys that came back with an import or a put.
- *left*: the group is empty; later writes fill the new dict (unfolded).
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from itertools import chain, compress, islice, repeat
from operator import is_
from typing import Any, Callable, Generator, Iterable, Iterator

from ..collector import freeze_survivors
from .base import KEY_GROUPS, PACK_CHUNK, Changes, KeyedState, PreparedEntries, StateView, chunked
from .groups import _numpy, group_bytes, key_groups, split_by_group
from .incremental import let_go, slices

_PICKLE = pickle.HIGHEST_PROTOCOL
LEAVE_KEYS = 2048         # taken keys a slice removes from the index (well under a millisecond)
LEAVE_PACE_S = 0.0002     # the pause between two slices: the PE's thread takes the GIL then
READ_AT_ONCE = 65536      # keys written since the last fold up to which a take reads an empty group at once
FIRST_KEYS_SLICE = 4096   # written keys whose groups a take computes per numpy call, looking for a key of each
GROUP_SLICE = 4 * LEAVE_KEYS  # written keys a fold's grouping lists and groups per step (_Fold._grouping)
_GUARDED = ("read", "put", "delete", "write_many", "delete_many")   # name keys: guarded while groups leave
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


class _Fold:
    """The keys written between two folds (``puts``, ``gone``), put into the group dicts ``tables``
    when :meth:`apply` is first called: by a snapshot's view (in the checkpoint's writer thread)
    or by the state's next fold, whichever comes first (the dicts are shared by both: in place,
    once). ``layers``: earlier writes a rescale's take set aside (:meth:`MemoryState.take_groups`),
    applied first, each but for the groups it was taken from (its ``done``).

    A take also sets the state's unfolded writes aside as one (``tables`` None: never applied
    itself; the state's fold or a later snapshot's fold applies it, :meth:`writes`), and its
    taken groups read their own part (:meth:`part`), off the PE's turn."""

    def __init__(self, tables: list[dict] | None, puts: dict, gone: set, layers: list["_Fold"] = ()) -> None:
        self.tables, self.puts, self.gone = tables, puts, gone     # never changed after: the state made new ones
        self.layers = list(layers)
        self.done: set[int] = set()         # groups taken: their writes go with them, not into tables
        self._grouped: tuple[list[bytes], bytes] | None = None
        self._parts: dict[int, tuple[dict, list]] = {}
        self._parted: set[int] = set()      # the groups _parts was made for (a later take adds to done)
        self._keys_in: tuple | None = None  # the keys put and deleted with their groups, for keys_of
        # Whoever applies it (the checkpoint's writer thread, the state's next fold, a taken
        # group's reader) holds this while it does: another waits, then finds it done.
        self.lock = threading.Lock()

    def _by_group(self) -> tuple[list[bytes], bytes]:
        """The groups of the keys put and of those deleted (not put again since): computed once."""
        if self._grouped is None:
            self._grouped = _finished(self._grouping())
        return self._grouped

    def _grouping(self) -> Generator[None, None, tuple[list[bytes], bytes]]:
        """:meth:`_by_group`'s work, :data:`GROUP_SLICE` keys per step (its return value): the
        groups of the keys put, as bytes of a slice each (a group a byte, in the order of
        ``puts``), and of the keys deleted (in :func:`_off`'s order). One ``list(puts)`` of the
        writes after a fill of 10^7 keys held the GIL for 118 ms in the thread that applied them
        (the leave thread, a checkpoint's writer), and a Replicate's turn in the PE's thread
        waited that long for it (its export 174-353 ms against 1-6).

        Bytes, and no list of the keys kept: the keys are read again from ``puts``, which is never
        changed. Kept as lists of 8,192 ints from here to the fold, they were young containers
        for the collector, and a young collection visits every item: at 10^7 keys, 5-18 ms in
        the checkpoints of the rows that missed the stall goal (session 61, docs/state-log.md)."""
        puts, gone = self.puts, self.gone   # another thread's apply may let them go meanwhile
        groups = []
        for part in slices(puts, GROUP_SLICE):
            groups.append(group_bytes(part))
            yield
        return groups, group_bytes(list(_off(puts, gone)))

    def paced(self) -> Iterator[None]:
        """:meth:`_by_group` a slice of keys at a time, yielding between slices (the leave thread
        sleeps there: the PE's thread and the worker's loop get the GIL meanwhile, as between its
        slices of keys)."""
        if self._grouped is not None or self.puts is None:
            return
        grouped = yield from self._grouping()
        with self.lock:
            if self._grouped is None and self.puts is not None:
                self._grouped = grouped

    def writes(self) -> Iterator[tuple[list, list, list, list, list]]:
        """What the groups not taken get (their keys put, groups, values, keys deleted, groups), a
        slice of :data:`GROUP_SLICE` keys put at a time (the deletes after the last), each made
        and let go in turn. As whole lists, after a take of a fill's writes (10^6 keys and more)
        they were freed together, one C call holding the GIL: the pairs that picked the groups
        not taken 30 ms in a checkpoint's writer at 10^7 keys (perf, session 54), and the values
        as long again (a reference each, a cache miss each)."""
        with self.lock:
            put_in, off_in = self._by_group()
            puts, gone, done = self.puts, self.gone, self.done
        for groups, part in zip(put_in, _keys(puts, put_in)):
            if done:
                kept = [g not in done for g in groups]
                groups, part = list(compress(groups, kept)), list(compress(part, kept))
            yield groups, part, list(map(puts.__getitem__, part)), [], []
        off = list(_off(puts, gone)) if off_in else []
        if off and done:
            gone = [g not in done for g in off_in]
            off_in, off = bytes(compress(off_in, gone)), list(compress(off, gone))
        if off:
            yield [], [], [], off_in, off

    def part(self, group: int) -> tuple[dict, list]:
        """Group ``group``'s writes (``{key: value}`` put, keys deleted): the keys split by group
        once, by the first taken group's reader (off the PE's turn)."""
        with self.lock:
            if group not in self._parted:
                put_in, off_in = self._by_group()
                parts: dict[int, tuple[dict, list]] = {}
                puts, done = self.puts, set(self.done)
                for g, key, value in zip(chain.from_iterable(put_in), puts, puts.values()):
                    if g in done:
                        parts.setdefault(g, ({}, []))[0][key] = value
                for g, key in zip(off_in, _off(puts, self.gone)):
                    if g in done:
                        parts.setdefault(g, ({}, []))[1].append(key)
                self._parts, self._parted = parts, done
            return self._parts.get(group, ({}, []))

    def keys_of(self, group: int) -> list:
        """The keys of group ``group`` put or deleted in these writes (an import's, in the PE's turn).

        Their groups computed once (:meth:`_by_group`; at 10^7 keys a Release's first import met
        3.2 * 10^5 keys written since the take: 35 ms), then each group's keys found by numpy, in
        C, not by a Python loop over them all in the turn of each of the 64 imports."""
        with self.lock:
            if self._keys_in is None:
                put_in, off_in = self._by_group() if self.puts is not None else ([], b"")
                # Lists of the keys now, while groups are imported (a rescale), not at each fold.
                keys = list(_keys(self.puts, put_in)) if put_in else []
                off = list(_off(self.puts, self.gone)) if off_in else []
                np = _numpy()
                if np is not None:          # a slice's groups an array each: no call over them all
                    put_in = [np.frombuffer(c, dtype=np.uint8) for c in put_in]
                    off_in = np.frombuffer(off_in, dtype=np.uint8)
                self._keys_in = (keys, put_in, off, off_in)
            keys, put_in, off, off_in = self._keys_in
        if type(off_in) is bytes:           # no numpy
            return [k for chunk, of in zip(keys, put_in) for k, g in zip(chunk, of) if g == group] + \
                [k for k, g in zip(off, off_in) if g == group]
        np = _numpy()
        return [chunk[i] for chunk, of in zip(keys, put_in) for i in np.flatnonzero(of == group).tolist()] + \
            [off[i] for i in np.flatnonzero(off_in == group).tolist()]

    def apply(self) -> None:
        # The keys' groups first, a slice per numpy call and outside the lock (``paced``): in one
        # call over every key written since the last fold (10^5 at a steady checkpoint of 10^7
        # keys, 10^6 and more after a fill or a rescale) the writer's thread held the GIL for it.
        for layer in list(self.layers):
            for _ in layer.paced():
                pass
        for _ in self.paced():
            pass
        with self.lock:
            if self.puts is None:
                return
            tables = self.tables
            # A long loop in a thread of its own: the interpreter hands the PE's thread the GIL every
            # switch interval, so the stream is not held for the whole fold.
            for layer in self.layers:
                for put_in, keys, values, off_in, off in layer.writes():
                    for g, key, value in zip(put_in, keys, values):
                        tables[g][key] = value
                    for g, key in zip(off_in, off):
                        tables[g].pop(key, None)
            put_in, off_in = self._by_group()
            puts = self.puts
            for g, key, value in zip(chain.from_iterable(put_in), puts, puts.values()):
                tables[g][key] = value
            for g, key in zip(off_in, _off(puts, self.gone)):
                tables[g].pop(key, None)
            self.puts = self.gone = self._grouped = None
            self.layers = []
        let_go(puts)


def _off(puts: dict, gone: set) -> Iterator[Any]:
    """A fold's keys deleted and not put again since, in one order each time (neither is ever changed)."""
    return (k for k in gone if k not in puts)


def _keys(puts: dict, groups: list[bytes]) -> Iterator[list]:
    """A fold's keys put, a list per slice of their ``groups`` (each made as it is asked for)."""
    it = iter(puts)
    for part in groups:
        yield list(islice(it, len(part)))


def _tracked() -> dict:
    """An empty dict the collector already tracks. A new empty dict is not tracked until a container
    is put in it, and is then tracked as a young object: a snapshot's new dicts of the keys written
    since (``_written``, ``_unfolded``: each key put since, with its value) stayed young for seconds
    while they grew, and at 10^7 keys a generation-1 collection met both at 21,769-58,152 entries
    once per checkpoint interval, 5-23 ms holding the GIL (session 60). Tracked now, the snapshot
    freezes them while they are empty (``collector.freeze_survivors``), so no collection visits
    their entries."""
    made = {None: []}
    del made[None]
    return made


def _finished(steps: Generator[None, None, Any]) -> Any:
    """A stepped computation (:meth:`_Fold._grouping`) run to its end in one go: its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class _Keys(AbstractSet):
    """The keys put (a dict's) and deleted (a set) since a snapshot, as :attr:`Changes.keys`: a set
    read by the checkpoint's writer, never copied into one on the PE's loop. ``before``: the
    dicts of keys put before each rescale's take since the snapshot (``_written_before``)."""

    def __init__(self, put: dict, deleted: set, before: tuple[dict, ...] = ()) -> None:
        self.put, self.deleted, self.before = put, deleted, before

    def __contains__(self, key: Any) -> bool:
        return key in self.put or key in self.deleted or any(key in b for b in self.before)

    def __iter__(self) -> Iterator[Any]:
        yield from self.put
        dicts = (self.put,)
        for earlier in self.before:
            yield from (k for k in earlier if not any(k in d for d in dicts))
            dicts += (earlier,)
        yield from (k for k in self.deleted if not any(k in d for d in dicts))

    def __len__(self) -> int:
        if self.before:
            return sum(1 for _ in self)
        return len(self.put) + sum(1 for k in self.deleted if k not in self.put)

    def let_go(self) -> None:
        """The checkpoint's writer is done with these keys (``incremental._emptied``): the dicts
        nothing else holds are emptied a slice at a time (:func:`incremental.let_go`)."""
        before, self.before = [self.put, *self.before], ()
        self.put = {}
        while before:
            entries = before.pop()
            let_go(entries)
            del entries


class MemoryView(StateView):
    """The group dicts as they were at the snapshot (shared with the state until it writes them)."""

    def __init__(self, tables: list[dict], changes: Changes | None = None, live: set | None = None,
                 on_release: Callable[[int], None] | None = None, fold: _Fold | None = None) -> None:
        self._tables = tables
        self._fold = fold                   # writes before the snapshot not yet in the dicts
        self.changes = changes
        if live is not None:                # the state copies shared values while this view lives
            live.add(id(self))
            self._end = weakref.finalize(self, on_release or live.discard, id(self))

    def _ready(self) -> list[dict]:
        if self._fold is not None:
            self._fold.apply()
            self._fold = None
        return self._tables

    def groups(self) -> list[int]:
        return [g for g, t in enumerate(self._ready()) if t]

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        return iter(self._ready()[group].items())

    def chunks(self, group: int) -> Iterator[Mapping]:
        """The group's own dict when it is one chunk (nobody writes it while the view lives: the
        state copies a group a view shares before writing it), else chunks copied from it."""
        table = self._ready()[group]
        return iter((table,)) if len(table) <= PACK_CHUNK else chunked(table.items())

    def by_group(self, keys: Iterable[Any]) -> dict[int, list]:
        keys = list(keys)
        return split_by_group(keys, key_groups(keys))

    def delta(self, group: int, keys: Iterable[Any]) -> tuple[dict, list]:
        """The keys' values read by ``map`` in C; a comprehension per key only when one is gone."""
        table = self._ready()[group]
        keys = list(keys)
        values = list(map(table.get, keys, repeat(_NOTHING)))
        if not any(map(is_, values, repeat(_NOTHING))):
            return dict(zip(keys, values)), []
        return ({k: v for k, v in zip(keys, values) if v is not _NOTHING},
                [k for k, v in zip(keys, values) if v is _NOTHING])

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
        self._pending: _Fold | None = None  # a snapshot's deferred fold, maybe not applied yet
        self._layers: list[_Fold] = []      # writes a take set aside, older than _unfolded (take_groups)
        self._written_before: tuple[dict, ...] = ()     # _written as each take since the snapshot left it
        self._vacant: set[int] = set()      # groups taken or dropped: no key here but what was written since
        self._leaving: dict[int, dict] = {}     # taken groups whose keys still wait to leave the index
        self._leave_lock = threading.Lock()     # one slice at a time leaves (take_groups)
        _leaver()
        self._bind()
        self._track()

    # -- the per-tuple calls: about one dict operation each -------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        """While no view is live this method is shadowed by the index's own ``dict.get``
        (:meth:`_bind`); this body runs while one is, and copies what the view may be reading."""
        if self._leaving:
            self._left((key,))
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
        """Two dict updates in C (three after a fold between two snapshots, :meth:`_alias`): an
        operator that gathers a batch's writes in a dict (one store per tuple) and writes them
        here once pays no Python call per key (a ``put`` is one, with two stores)."""
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
        if self._leaving:                   # the index still holds keys taken away: the groups do not
            self._fold()
            return (kv for table in list(self._tables) for kv in table.items())
        return iter(self._index.items())

    def writable(self) -> dict:
        return self._written

    def __len__(self) -> int:
        if self._leaving:                   # the index still holds keys taken away: the groups do not
            self._fold()
            return sum(map(len, self._tables))
        return len(self._index)

    # -- views: the lookup that copies while one is live -----------------------------------------
    def _bind(self) -> None:
        """``get`` is the index's ``dict.get`` while no view is live, else the copying method;
        ``read`` is it whenever no taken group is leaving (it never copies: a view may be live,
        as it is for most of a fill, whose checkpoints are long; else the guarded call)."""
        with _BIND:
            if self._live or self._leaving:
                self.__dict__.pop("get", None)
            else:
                self.get = self._index.get
            if not self._leaving and type(self).read is MemoryState.read:   # a subclass's own stays
                self.read = self._index.get

    def _released(self, view_id: int, changes: Changes | None = None) -> None:
        self._let_go(changes)               # no checkpoint took them: the next snapshot's carry them
        self._live.discard(view_id)
        if not self._live:
            self._bind()

    def __getstate__(self) -> dict:
        self._leave_all()
        self._settle()
        if self._layers:
            self._fold()
        state = dict(self.__dict__)
        state["_pending"] = None
        state.pop("get", None)              # a bound lookup of the old index: bound again on load
        for name in ("_leave_lock", *_GUARDED):
            state.pop(name, None)
        state["_live"] = set()              # views are not pickled with the state
        state["_carried"] = ()              # nor their changes (a copy's first checkpoint: whole files)
        state["_adopted"] = {}
        state["_shared"] = set()
        return state

    def __setstate__(self, state: dict) -> None:
        state.setdefault("_layers", [])
        state.pop("_stale", None)           # a state pickled before _written_before
        state.setdefault("_written_before", ())
        state.setdefault("_vacant", set())
        state.setdefault("_adopted", {})
        self.__dict__.update(state)
        self._leaving, self._leave_lock = {}, threading.Lock()
        self._bind()

    # -- key groups: folded from the writes when asked --------------------------------------------
    def _settle(self) -> None:
        """The deferred fold of the last snapshot applied (normally its checkpoint's writer did), and
        let go: the dicts of its snapshot's groups that a take gave away since (the state holds
        empty ones for them now) go to the leave thread, which empties them a slice at a time
        (:class:`_GivenAway`). Let go here with the fold, they were freed in this turn, one C call a
        dict: the Release's first import after a Replicate at 10^7 keys, 120-154 ms (session 61)."""
        fold = self._pending
        if fold is not None:
            fold.apply()
            self._pending = None
            tables, fold.tables = fold.tables, None
            given = [t for t, now in zip(tables or (), self._tables) if t is not now and t]
            if given:
                _leave_later(_GivenAway(given))

    def _fold(self) -> None:
        """Bring the group dicts up to date with the index: O(keys written since the last fold),
        their groups computed in one batch. A group a live view shares is copied first; once no
        view lives, none is. Only what came since the last fold: an operator that writes after
        each group it reads (a sweep) folds once per group, and a fold of every key written since
        the snapshot made that sweep cost groups x keys written (ep_patterns ran 0.3x its dict).
        The writes a take set aside (``_layers``) come first, but for the groups taken."""
        self._settle()
        unfolded, unfolded_gone, layers = self._unfolded, self._unfolded_gone, self._layers
        if not unfolded and not unfolded_gone and not layers:
            return
        if not self._live:
            self._shared.clear()
        index = self._index
        writes = [w for layer in layers for w in layer.writes()]
        gone = [k for k in unfolded_gone if k not in index]     # not put again (or imported) since
        # Computed at each fold, not remembered: a batch costs less per key than a memo's
        # check, insert and lookup did (measured at 10^5 keys), and holds no memory between folds.
        writes.append((key_groups(list(unfolded)), unfolded, unfolded.values(), key_groups(gone), gone))
        for put_in, keys, values, taken_from, off in writes:
            self._write(put_in, keys, values, taken_from, off)
        self._unfolded, self._unfolded_gone, self._layers = _tracked(), set(), []

    def _write(self, put_in: list, keys: Iterable, values: Iterable, taken_from: list, gone: list) -> None:
        """Keys put and deleted into their groups' dicts (groups given), shared groups copied first."""
        tables = self._tables
        touched = set(put_in).union(taken_from)
        for g in touched & self._shared:
            self._unshare(g)
        self._changed |= touched
        # Hot loop: one dict store per key written (the groups were looked up in one pass above).
        for g, key, value in zip(put_in, keys, values):
            tables[g][key] = value
        for g, key in zip(taken_from, gone):
            tables[g].pop(key, None)

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
        """O(key groups): the keys written since the last fold are folded by whoever reads the
        view or the groups first (:class:`_Fold`; at once if an earlier view is still live), and
        the changed keys, the next incremental checkpoint's input, are handed over uncopied.

        They are ``writable()``'s dict itself, and ``writable()`` is a new one from here on (an
        operator asks for it once per batch, never across a snapshot). The barrier copied that
        dict and cleared it in place, two C passes that touched every key and value put since the
        last snapshot, scattered in memory: deployed at 10^6 keys the copy alone held the barrier's
        turn 2-25 ms for 15,000-33,000 keys (in process, with the values fresh in the cache,
        0.1 ms); at 10^7 a steady checkpoint follows 10^5 of them."""
        self._settle()
        fold = None
        if self._live:                      # an earlier view may read the dicts: copy-on-write now
            self._fold()
        elif self._unfolded or self._unfolded_gone or self._layers:
            fold = self._pending = _Fold(self._tables, self._unfolded, self._unfolded_gone, self._layers)
            self._unfolded, self._unfolded_gone, self._layers = _tracked(), set(), []
        put, self._written = self._written, _tracked()      # O(1): nobody may hold it past a snapshot
        changes = self._changes(_Keys(put, self._deleted, self._written_before), self._whole)
        self._deleted, self._whole, self._written_before = set(), set(), ()
        self._shared = set(range(KEY_GROUPS))
        self._changed = set()
        view = MemoryView(self._tables, changes, self._live, lambda view_id: self._released(view_id, changes), fold)
        self._tables = list(self._tables)   # the view keeps the list, the state writes its own copy
        self._bind()
        freeze_survivors()                  # its new dicts among them (_tracked)
        return view

    def changed(self) -> set[int]:
        self._fold()
        return set(self._changed)

    def drop_groups(self, groups: Iterable[int]) -> None:
        for g in groups:
            self._put_group(g, {})

    def take_groups(self, groups: Iterable[int]) -> dict[int, Mapping]:
        """The group dicts themselves, replaced by empty ones, in a rescale's turn: O(groups taken),
        never O(keys held) nor O(keys written) (at 10^6 keys a Replicate's turn spent 465 ms
        removing the taken keys from the index, 240-580 ms in a fold that copied every group a
        checkpoint's live view shared, then 116-1,330 ms sorting out the taken groups' writes of
        the fill since the last checkpoint):

        - no fold, no key visited: the writes since the last fold are set aside whole, as a
          layer (``_layers``, a :class:`_Fold` without tables) that the state's next fold (or the
          next snapshot's) applies to the groups that stay, and each taken group is a
          :class:`TakenGroup` (its dict, the snapshot's deferred fold and the layers) whose reader,
          off the turn (the packer, the leave thread), applies what it owes and copies it;
        - the taken keys leave the flat index afterwards, in another thread (:meth:`_leave`).
          Until they are gone nothing sees them: the routers send none of their tuples here any
          more, a call naming a key lets its group go first (:meth:`_guard`), ``entries`` and
          ``len`` go by the groups, an import or a pickle of the state lets them all go;
        - :meth:`writable` is a new dict (the keys put before stay among the snapshot's changed
          keys); the groups are vacant: an import of one back folds nothing (:meth:`_put_group`).

        A group whose dict was empty at the last fold is read at once (its keys, if any, are all
        in the writes) while at most :data:`READ_AT_ONCE` keys were written since: O(keys written)
        for it, as when the state is new. Past that, a key of each such group is looked for among
        the writes a slice at a time (:func:`_first_keys`: a few slices, unless a group has none)
        and the group is taken as the others, its part read off the turn: a Replicate before any
        checkpoint (or with none) at 10^7 keys grouped every key written in its turn, 6.3-6.6 s."""
        chosen = set(groups)
        self._set_aside()
        # A layer gives each group's part once: not again to a later take of a group that came back.
        owed = {g: tuple(layer for layer in self._layers if g not in layer.done) for g in chosen}
        for layer in self._layers:
            layer.done |= chosen
        pending = self._pending
        if pending is not None and pending.puts is None:
            pending = None
        # each fold's writes read once: the checkpoint's writer thread may apply the snapshot's
        # fold meanwhile, which lets go of them (its puts and gone become None), never changes them
        writes = [(f.puts, f.gone) for f in (pending, *self._layers) if f is not None]
        written = sum(len(puts or ()) + len(gone or ()) for puts, gone in writes)
        empty = [g for g in chosen if not self._tables[g]]
        firsts = _first_keys([puts for puts, _ in writes if puts], empty) if written > READ_AT_ONCE and empty else None
        taken: dict[int, Mapping] = {}
        for g in sorted(chosen):
            table = self._tables[g]
            if not table and firsts is not None:
                if g not in firsts:         # no key of it put since the last fold: nothing to take
                    self._changed.add(g)    # (a delete of one would be: written whole, empty)
                    continue
            elif not table:                 # empty at the last fold: its keys, if any, are in the writes
                if pending is not None:
                    pending.apply()
                wrote = [layer.part(g) for layer in owed[g]]
                if not table and not any(puts for puts, _gone in wrote):
                    if any(gone for _puts, gone in wrote):
                        self._changed.add(g)
                    continue
            taken[g] = TakenGroup(table, pending, owed[g], g, firsts.get(g) if firsts else None)
            self._tables[g] = {}
            self._shared.discard(g)
            self._changed.add(g)
            self._replaced(g)
        self._vacant |= chosen
        if taken and self._written:         # writable() holds no value a take gave away: a new dict
            self._written_before += (self._written,)
            self._written = {}
        if taken:
            with self._leave_lock:
                start = not self._leaving
                self._leaving.update(taken)
                self._guard()
            if start:
                _leave_later(self)
        return taken

    def _guard(self) -> None:
        """While taken keys are still in the index, a call naming a key first lets that key's group
        go if it is one of them (``key_group`` per call: about 1 us, for as long as they leave)."""
        cls, left = type(self), self._left
        for name in _GUARDED:
            method = getattr(cls, name).__get__(self)
            if name in ("write_many",):
                def call(puts, deletes=(), _m=method):
                    if type(puts) is not dict:  # pairs, or a dict (write_batch's form) taken as it is
                        puts = dict(puts)
                    deletes = list(deletes)
                    left([*puts, *deletes])
                    return _m(puts, deletes)
            elif name == "delete_many":
                def call(keys, _m=method):
                    keys = list(keys)
                    left(keys)
                    return _m(keys)
            else:
                def call(key, *rest, _m=method):
                    left((key,))
                    return _m(key, *rest)
            self.__dict__[name] = call
        self._bind()

    def _unguard(self) -> None:
        """The plain calls again, unless a take came meanwhile."""
        with self._leave_lock:
            if self._leaving:
                return
            for name in _GUARDED:
                self.__dict__.pop(name, None)
            self._bind()

    def _left(self, keys) -> None:
        """Let the groups of ``keys`` that are still leaving go now."""
        leaving = self._leaving
        if leaving:
            for g in set(key_groups(list(keys))) & leaving.keys():
                self._leave_one(g)

    def _leave(self) -> None:
        """The taken groups' keys out of the index, :data:`LEAVE_KEYS` at a time, paced: between
        two slices this thread sleeps, so the PE's thread, which wants the GIL, has it at once
        (a pace, not a wait for anything; without it the PE waited up to the interpreter's
        5 ms switch interval each time). The PE's gets and puts of other keys go on meanwhile:
        each is one dict operation, atomic under the GIL. An import or a guarded call may let a
        group go meanwhile (:meth:`_leave_one`): its dict is no longer the one leaving, this
        thread goes on to the next."""
        for _ in self._slices():
            time.sleep(LEAVE_PACE_S)
        self._unguard()

    def _slices(self) -> Iterator[None]:
        """:meth:`_leave`'s work, one slice of :data:`LEAVE_KEYS` keys per step (a test steps it
        between the PE's calls). Each slice holds the leave lock and first checks that its group is
        still the one leaving: a guarded call or an import that let the group go meanwhile may have
        put its keys back, which this slice must not pop."""
        lock, leaving, pop = self._leave_lock, self._leaving, self._index.pop
        while True:
            with lock:
                if not leaving:
                    return
                g, table = next(iter(leaving.items()))
            if isinstance(table, TakenGroup):   # nobody writes it once its fold is applied
                keys = yield from table.leaving_keys()
            else:
                keys = list(table)
            for i in range(0, len(keys), LEAVE_KEYS):
                with lock:
                    if leaving.get(g) is not table:
                        break
                    for key in keys[i:i + LEAVE_KEYS]:
                        pop(key, None)
                yield
            with lock:
                if leaving.get(g) is table:
                    del leaving[g]

    def _leave_one(self, group: int | None = None) -> bool:
        """One taken group's keys out of the index (``group``, or any); False once none is left."""
        with self._leave_lock:
            if not self._leaving:
                return False
            g = next(iter(self._leaving)) if group is None else group
            table = self._leaving.get(g)
            if table is not None:
                pop = self._index.pop
                for key in table:
                    pop(key, None)
                del self._leaving[g]
            return bool(self._leaving)

    def _leave_all(self) -> None:
        """Every taken group's keys out of the index now, in the caller's thread."""
        while self._leave_one():
            pass
        self._unguard()

    def import_groups(self, exported: dict) -> None:
        """As the contract's, a :class:`TakenGroup` (another memory state's take) as its dict, and a
        :class:`PreparedGroup` (:func:`prepare_group`) installed as the group's dict itself."""
        for g, d in exported.items():
            if type(d) is PreparedGroup:
                if d.group != g:
                    raise ValueError(f"a prepared key group {d.group} given as group {g}")
                self._put_group(g, d.entries, owned=True)
                self._replaced(g, d.received)   # a part's bytes, a restore's files: its next chain starts there
            else:
                super().import_groups({g: dict(d) if isinstance(d, TakenGroup) else d})

    def _put_group(self, group: int, entries: dict, owned: bool = False) -> None:
        """``owned``: nobody else holds ``entries`` (a prepared group): it becomes the group's dict."""
        if group in self._leaving:          # taken earlier, back now: its old keys leave first
            self._leave_one(group)
        index, written = self._index, self._written
        if group in self._vacant:
            self._written_since_vacant(group)
        else:
            self._fold()
        for key in self._tables[group]:     # (a vacant group's dict may still hold a key deleted since)
            index.pop(key, None)
            written.pop(key, None)
        self._tables[group] = entries if owned else dict(entries)
        index.update(entries)
        if entries:
            self._vacant.discard(group)
        else:
            self._vacant.add(group)
        self._shared.discard(group)
        self._changed.add(group)
        self._replaced(group)

    def _set_aside(self) -> None:
        """The writes since the last fold set aside whole, as a layer (a take's, a vacant group's
        import): O(1), the next fold applies it but for the groups it counts as done."""
        if self._unfolded or self._unfolded_gone:
            self._layers.append(_Fold(None, self._unfolded, self._unfolded_gone))
            self._unfolded, self._unfolded_gone = {}, set()

    def _written_since_vacant(self, group: int) -> None:
        """The keys written to ``group`` since it was taken or dropped out of the index and
        :meth:`writable`, without a fold: an import replaces them. The routers send a taken
        group no tuple, so there are normally none, but which they are needs the keys' groups.

        A fold here applied every write since the last one, to every group, in the import's
        turn: at 10^7 keys a Release's first import folded the fill's writes that the Replicate's
        take had set aside (a layer of millions of keys), 3.2 s. Here only the writes since
        ``group`` became vacant are looked at: those of the layers a later take or import set
        aside (each sorted by group once, :meth:`_Fold.keys_of`) and the unfolded ones, set aside
        as a layer now (O(1)). Each layer then counts ``group`` as done: its writes to ``group``
        are never applied over the import. The layers older than the take already do; the
        snapshot's deferred fold writes the dicts of its view, not the group's dict since."""
        self._settle()                      # its writes since are in _tables[group] then
        self._set_aside()
        index, written = self._index, self._written
        for layer in self._layers:
            if group not in layer.done:
                for key in layer.keys_of(group):
                    index.pop(key, None)
                    written.pop(key, None)
                layer.done.add(group)


class PreparedGroup(PreparedEntries):
    """A key group's entries unpickled off the PE's turn (a lazy restore's loader thread) that
    nobody else holds: :meth:`MemoryState.import_groups` makes the dict itself the group's, with
    no copy in the turn (what is left there is the flat index's update, in C). A mapping of its
    entries for any other reader; pickles as the dict."""


def prepare_group(group: int, entries: dict, where: str | None = None) -> PreparedGroup:
    """``entries`` (of key group ``group``, just unpickled from its checkpoint file) handed over
    as they are (``where``: the disk backend's, unused here)."""
    return PreparedGroup(group, entries)


_QUEUE: "queue.SimpleQueue[MemoryState]" = queue.SimpleQueue()
_LEAVER: list[threading.Thread] = []
_LEFT = threading.Condition()     # notified each time the leave thread is done with a queued state
_QUEUED = [0]                     # states queued and not yet done with (under _LEFT)


def _leaver() -> None:
    """The process's one thread that removes taken keys from the states' indexes (started with the
    first state, idle on its queue until a take: a take in a PE's turn only queues, it never waits
    for a thread to start, which under load took milliseconds of scheduling)."""
    if not _LEAVER or not _LEAVER[0].is_alive():
        with _BIND:
            if not _LEAVER or not _LEAVER[0].is_alive():
                _LEAVER[:] = [threading.Thread(target=_leave_queued, name="memory-state-leave", daemon=True)]
                _LEAVER[0].start()


def _leave_queued() -> None:
    while True:
        state = _QUEUE.get()
        try:
            state._leave()
        except Exception:                   # pragma: no cover - a bug: the guarded calls still hold
            logging.getLogger(__name__).exception("taken keys did not leave the index")
        finally:
            del state
            with _LEFT:
                _QUEUED[0] -= 1
                _LEFT.notify_all()


class _GivenAway:
    """Group dicts a take gave away that a snapshot's deferred fold still held (its snapshot's), for
    the leave thread (:meth:`MemoryState._settle`): each emptied a slice at a time where nothing
    else holds it (``incremental.let_go``; a live view's reader may still, then it is only let go)."""

    def __init__(self, tables: list[dict]) -> None:
        self._tables = tables

    def _leave(self) -> None:
        tables, self._tables = self._tables, []
        while tables:
            entries = tables.pop()
            let_go(entries)
            del entries


def _leave_later(state: "MemoryState | _GivenAway") -> None:
    with _LEFT:
        _QUEUED[0] += 1
    _leaver()
    _QUEUE.put(state)


def leaves_done(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the leave thread to finish every take queued so far in this
    process (paced, a take of 10^6 keys keeps it busy for a second or more, computing key groups and
    popping keys in turns with whatever runs next). True once it has; False on the timeout. The quiet
    point a test or a bench waits for before it times or counts anything the thread would share."""
    with _LEFT:
        return _LEFT.wait_for(lambda: not _QUEUED[0], timeout)


def _first_keys(puts: list[dict], groups: list[int]) -> dict[int, Any]:
    """A key of each of ``groups`` among the keys ``puts`` (folds' writes) hold, where there is one:
    their groups computed :data:`FIRST_KEYS_SLICE` at a time until each group has a key (with 128
    groups evenly used, the first slice). A group none of them holds costs a pass over them all."""
    want, found = set(groups), {}
    for written in puts:
        keys = iter(written)
        while want and (part := list(islice(keys, FIRST_KEYS_SLICE))):
            for g, key in zip(key_groups(part), part):
                if g in want:
                    found[g] = key
                    want.discard(g)
        if not want:
            break
    return found


class TakenGroup(Mapping):
    """A key group taken in a rescale's turn (:meth:`MemoryState.take_groups`): its dict as of the
    last fold, the snapshot's deferred fold (which may still owe it writes, in place: the view
    reads the same dict) and the writes set aside since (``layers``, this group's part of each).
    Whoever reads it first, off the turn (the packer, the leave thread), applies those and copies
    the dict (a live view may share it); nothing writes it after. Pickles as the plain dict."""

    def __init__(self, table: dict, pending: _Fold | None, layers: tuple[_Fold, ...], group: int,
                 first: Any = None) -> None:
        self._parts = (table, pending, layers, group)
        self._first = first                 # a key of it put since the last fold, found by the take
        self._entries: dict | None = None
        self._lock = threading.Lock()

    def _now(self) -> dict:
        entries = self._entries
        if entries is None:
            with self._lock:                # the leave thread and the packer may come at once
                entries = self._entries
                if entries is None:
                    table, pending, layers, group = self._parts
                    if pending is not None:
                        pending.apply()     # the writes before the snapshot, in place (the view's too)
                    entries = dict(table)
                    for layer in layers:
                        puts, gone = layer.part(group)
                        entries.update(puts)
                        for key in gone:
                            entries.pop(key, None)
                    self._entries = entries
                    self._parts = (None, None, (), group)
        return entries

    def leaving_keys(self) -> Iterator[None]:
        """The group's keys for the leave thread (the generator's return value), without the copy:
        the deferred fold applied, the keys in its dict and those its layers put (a deleted key is
        not in the index). The keys' groups are computed a slice at a time, yielding between."""
        table, pending, layers, group = self._parts
        if self._entries is not None or table is None:
            return list(self._now())
        if pending is not None:
            yield from pending.paced()
            pending.apply()                 # then nobody writes the dict
        keys = list(table)
        for layer in layers:
            yield from layer.paced()
            keys += layer.part(group)[0]
        return keys

    def first_key(self) -> Any:
        """A key of the group (it stands for its group in a snapshot's form), read without the
        copy: the turn asks for one (``groups.take_groups``)."""
        table = self._parts[0]
        if self._first is not None:
            return self._first
        if self._entries is None and table:
            try:
                return next(iter(table))
            except RuntimeError:            # the deferred fold wrote it meanwhile (writer thread)
                pass
        return next(iter(self._now()))

    def __getitem__(self, key: Any) -> Any:
        return self._now()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())

    def items(self):
        """The dict's own view: a rescale's packer reads the group through it, in C (the mapping's
        default steps into :meth:`__getitem__` once a key: 90 of 123 samples of a part's packing
        at 10^7 keys, traced)."""
        return self._now().items()

    def __reduce__(self):
        return dict, (self._now(),)

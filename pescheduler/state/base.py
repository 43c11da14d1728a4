"""The keyed-state contract: values by key, partitioned into the key groups copies own.

A KEYED operator's state is a map from its keys to values. Copies of an operator
own whole key groups (``pescheduler/wire.py``: ``key_group(key)``, 128 of them), so
everything that moves state (a checkpoint, a restore, a Replicate or Release)
moves whole key groups: :meth:`KeyedState.export_groups` and
:meth:`KeyedState.import_groups` carry them in one format whatever the backend,
and :meth:`KeyedState.changed` says which groups a checkpoint must write again.

A value read with :meth:`KeyedState.get` must not be changed in place: put the
new value back. That is what lets the ``memory`` backend give a consistent view
of every key group at a snapshot without copying them (copy-on-write of a
group happens at its first write after the snapshot), and the ``disk`` backend
store values as bytes.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import pickle
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sized
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from ..wire import KEY_GROUPS, key_group

__all__ = ["KEY_GROUPS", "Changes", "KeyedState", "StateView", "key_group", "pack_chunks", "pack_group", "unpack_group"]


PACK_CHUNK = 1024          # entries pickled in one call: the longest the writer holds the GIL (pack_group)
CARRY_MAX = 8              # snapshots let go unwritten whose changes the next snapshot carries
_CARRY = threading.RLock()  # a view is let go in the writer's thread or the worker's loop, the next
                            # snapshot is taken in the PE's (KeyedState._let_go); re-entrant: a view's
                            # finalizer may run in a collection inside the lock (what it carries is then
                            # lost at worst: the next checkpoint writes whole, as before)


def pack_group(items: Iterable[tuple[Any, Any]]) -> bytes:
    """One key group's entries as bytes: the format every backend exports and imports.

    Pickled ``{key: value}`` dicts of at most :data:`PACK_CHUNK` entries, one after the other (a
    group that small is one pickled dict). Pickling holds the GIL for the whole call, and a
    checkpoint packs groups in a worker thread beside the PE's: at 10^7 keys a group holds ~78,000
    entries, and one call for it would hold the stream that long. In a worker holding 10^7 keys a
    call for 8,192 entries took 3-33 ms (its values scattered over 4 GB, not 0.6 ms as in a fresh
    process), and the PE's outputs stalled 58-104 ms beside the longest (traced); for 1,024,
    2.1-3.7 ms. Smaller chunks cost nothing measurable: a 78,000-entry group packs and unpacks
    as fast in 1,024-entry chunks as in 8,192 (in process), and its bytes grow 0.2 %."""
    return pack_chunks(chunked(items))[0]


def chunked(items: Iterable[tuple[Any, Any]]) -> Iterator[dict]:
    """``items`` as dicts of at most :data:`PACK_CHUNK` entries (made in C)."""
    it = iter(items)
    while chunk := dict(itertools.islice(it, PACK_CHUNK)):
        yield chunk


def pack_chunks(chunks: Iterable[Mapping]) -> tuple[bytes, int, Any]:
    """:func:`pack_group`'s bytes of a group given as dicts of at most :data:`PACK_CHUNK` entries
    (:meth:`StateView.chunks`), the entries they hold (counted by the chunks' lengths) and its
    first key (None when empty): what a checkpoint's full file needs. A generator stepping once
    per entry to count them (``state/incremental.py``'s ``_counted``) was 9-14.5 % of the
    writer's GIL on disk at 10^6 keys, and a memory view's group was copied into chunks before
    it was pickled."""
    parts, count, first = [], 0, None
    for chunk in chunks:
        if not parts:
            first = next(iter(chunk), None)
        parts.append(pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL))
        count += len(chunk)
    if not parts:
        return pickle.dumps({}, protocol=pickle.HIGHEST_PROTOCOL), 0, None
    return (b"".join(parts) if len(parts) > 1 else parts[0]), count, first


def unpack_group(data: bytes) -> dict:
    """The entries :func:`pack_group` packed, ``{key: value}`` (a mapping already unpacked, such as
    a backend's prepared group of a lazy restore, as a dict). A group in a backend's own form (a
    disk store's bytes: one pickle whose reduce decodes them) unpickles as its dict."""
    if isinstance(data, Mapping):
        return dict(data)
    f = io.BytesIO(data)
    entries = pickle.load(f)
    while f.tell() < len(data):
        entries.update(pickle.load(f))
    return entries


# ``prepare(group, entries)`` of the receiving store while a key group is unpickled: a group in a
# backend's own form reads it (``disk._unpickled_raw``) and is made ready as that form, not decoded
_PREPARE: ContextVar[Callable[[int, Any], Any] | None] = ContextVar("pescheduler_prepare_group", default=None)


@contextlib.contextmanager
def preparing(prepare: Callable[[int, Any], Any], received: bool = False) -> Iterator[None]:
    """Key groups unpickled inside are made ready by ``prepare`` (``groups.loads_prepared``,
    :func:`unpack_prepared`); ``received``: a rescale's part, whose groups keep the bytes they
    came as (:func:`keep_received`)."""
    token, kept = _PREPARE.set(prepare), _RECEIVED.set(received)
    try:
        yield
    finally:
        _PREPARE.reset(token)
        _RECEIVED.reset(kept)


# a rescale's part is being unpickled (``groups.loads_prepared``): its groups keep their bytes
_RECEIVED: ContextVar[bool] = ContextVar("pescheduler_received_group", default=False)


@dataclass(frozen=True)
class Received:
    """A key group as a rescale's part brought it, in a checkpoint's full-file form (memory:
    :func:`pack_group`'s bytes, as the part carried them; disk: its ``RawPart`` pickled, the
    store's compressed bytes). The receiving state's next checkpoint writes these bytes as the
    group's full file and the keys written since the import as a delta on it
    (``incremental.ChainWriter``), instead of reading the group back out of the store and
    packing it again: after a Release at 10^7 keys that first checkpoint rewrote the 64 groups
    coming back whole, 6-9 s of the writer beside the PE, its gaps 19-88 ms (docs/state-log.md).
    A lazy restore's group names the files it was read from instead (``ref``): the restored
    state's next checkpoints grow that chain, where they rewrote every group whole."""

    data: bytes | None
    keys: int                   # entries it holds
    first: Any                  # one of its keys (the chain's key: it stands for the group)
    ref: Any = None             # or the checkpoint's files a lazy restore read it from (an
                                # ``incremental.GroupRef``): its chain goes on from them, nothing written


def keep_received(prepared: Any, data: Callable[[], bytes]) -> Any:
    """``prepared`` (a backend's :class:`PreparedEntries`) keeping the bytes ``data()`` gives
    when a rescale's part is being unpickled (:func:`preparing`'s ``received``)."""
    return came_from(prepared, data=data()) if _RECEIVED.get() else prepared


def came_from(prepared: Any, data: bytes | None = None, ref: Any = None) -> Any:
    """``prepared`` (a backend's :class:`PreparedEntries`, not empty) with the :class:`Received`
    of ``data`` (a part's bytes) or ``ref`` (a restore's files); anything else as it is."""
    if isinstance(prepared, PreparedEntries) and len(prepared):
        prepared.received = Received(data, len(prepared), prepared.first_key(), ref)
    return prepared


def unpack_prepared(group: int, data: bytes | Mapping, prepare: Callable[[int, Any], Any]) -> Any:
    """``prepare(group, unpack_group(data))``, except that a group in a backend's own form (a
    checkpoint's full file of a disk store: its stored bytes) goes to ``prepare`` as that form,
    which the disk backend writes into its SST file as it is (a lazy restore's loader thread)."""
    if isinstance(data, Mapping):
        return prepare(group, data)
    f = io.BytesIO(data)
    with preparing(prepare):
        entries = pickle.load(f)
    if type(entries) is not dict:           # made ready as it was unpickled
        return entries
    while f.tell() < len(data):
        entries.update(pickle.load(f))
    return prepare(group, entries)


class PreparedEntries(Mapping):
    """A key group's entries unpickled off the PE's turn (a lazy restore's loader thread), with
    what a backend made ready from them there (``prepare_group`` of ``state/memory.py`` and
    ``state/disk.py``): a mapping of the entries for any other reader, pickling as their dict.
    ``received``: the bytes a rescale's part brought them as, or the checkpoint files a lazy
    restore read them from (:class:`Received`), or None."""

    received: "Received | None" = None

    def __init__(self, group: int, entries: dict) -> None:
        self.group, self.entries = group, entries

    def first_key(self) -> Any:
        """One of its keys, without reading the others (a chain's key)."""
        return next(iter(self.entries))

    def __getitem__(self, key: Any) -> Any:
        return self.entries[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __reduce__(self):
        return dict, (self.entries,)


@dataclass
class Changes:
    """What one state was written between its previous snapshot and this one: an incremental
    checkpoint writes these keys' groups as deltas (``state/incremental.py``).

    A checkpoint's writer builds a chain's delta on the keys of every snapshot since the chain's
    last file, so it must see each snapshot's Changes: one it never saw (an aborted checkpoint's
    views let go before the write, a reconfiguration's or a hand-over's snapshot, packed and let
    go) made it write every group whole (issue 30: after a Replicate at 10^7 keys, the groups the
    original kept, 51 of them). A view let go before a writer took its Changes hands them back to
    its state (:meth:`KeyedState._let_go`), and the next snapshot's carry them in ``before``."""

    token: str                          # the state object (a new one starts every chain again)
    seq: int                            # this snapshot's number in that state (1, 2, ...)
    keys: Iterable = field(default_factory=set)     # keys put or deleted, in the backend's form (any
                                                    # collection: memory's is its dicts, read off the loop,
                                                    # with a let_go() the writer calls when done with them;
                                                    # disk's a dict of each one's last pickled value)
    whole: set = field(default_factory=set)         # key groups replaced whole (import, drop)
    before: tuple = ()                  # earlier snapshots' Changes whose views were let go unwritten
    taken: bool = False                 # a checkpoint's writer has them (ChainWriter): not carried on
    adopted: dict = field(default_factory=dict)     # groups of whole an import replaced last that kept
                                                    # what it came from, {group: Received}: a chain starts there
    one_step: bool = False              # its view's delta holds what changed since the snapshot before
                                        # only (a memory window's: keys' places, operators/pane_layers.py):
                                        # a chain whose last file is older is written whole


class StateView(ABC):
    """A consistent, read-only view of a :class:`KeyedState` as it was at :meth:`KeyedState.snapshot`.

    Writes to the state after the snapshot do not show here, so the bytes of
    a checkpoint can be produced from a view while the stream goes on.
    Call :meth:`release` when done (the ``disk`` backend holds a store snapshot).
    """

    @abstractmethod
    def groups(self) -> list[int]:
        """The key groups holding at least one key, ascending."""

    @abstractmethod
    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` of one key group."""

    def chunks(self, group: int) -> Iterator[Mapping]:
        """One key group's entries as dicts of at most :data:`PACK_CHUNK` (what a full file
        pickles, :func:`pack_chunks`): a backend gives them without a step per entry where it
        can (memory: the group's own dict; disk: built in its read loop)."""
        return chunked(self.items(group))

    def full(self, group: int) -> tuple[bytes, int, Any]:
        """A checkpoint's full file of one key group: :func:`pack_chunks` of :meth:`chunks` (its
        bytes, entries and first key), or a backend's own form that :func:`unpack_group` reads
        (disk: its stored bytes, nothing decoded)."""
        return pack_chunks(self.chunks(group))

    def group_snapshot(self, group: int) -> tuple[Any, bytes]:
        """``(a key of it, bytes)`` of one key group, as a snapshot read in the PE's turn holds it
        (a rescale's, a merge's: ``incremental.GroupsSnapshot``): :func:`pack_group` of its
        entries, or a view's own form (a memory window's panes: ``operators/pane_layers.py``)."""
        entries = dict(self.items(group))
        return next(iter(entries)), pack_group(entries.items())

    def export(self, groups: Iterable[int] | None = None) -> dict[int, bytes]:
        """``{group: bytes}`` of ``groups`` (default: every non-empty one), for :meth:`KeyedState.import_groups`."""
        chosen = self.groups() if groups is None else sorted(groups)
        return {g: pack_group(self.items(g)) for g in chosen}

    def release(self) -> None:
        """Let go of what the view holds."""

    def reads_whole(self) -> None:
        """Before the first read: key groups will be read whole (:meth:`full`: every group in a
        checkpoint with no earlier one to build on, the groups a rescale replaced in the first
        after it), which a backend may prepare for (disk: an iterator per group, read in rocksdict's
        loop rather than a Python step a key). The default does nothing."""

    def reads_full(self, groups: Iterable[int]) -> None:
        """Before a checkpoint's first file, its writer names the only groups it may ask
        :meth:`full` for (the groups it may rewrite whole; the others get a delta or stay as
        they were): a backend may read only those (a memory window's panes:
        ``operators/pane_index.py``). The default does nothing."""

    changes: Changes | None = None      # set by the snapshot that made the view

    @abstractmethod
    def by_group(self, keys: Iterable[Any]) -> dict[int, list]:
        """``keys`` (of :attr:`Changes.keys`) by key group."""

    @abstractmethod
    def delta(self, group: int, keys: Iterable[Any]) -> tuple[Sized, Collection]:
        """``(puts, deleted keys)`` of ``keys`` (one group's, :meth:`by_group`) in this view, as a
        checkpoint writes them: ``puts`` a ``{key: value}`` dict, or a backend's own form whose
        length is the keys put and which unpickles as the pair decoded (``disk.RawDelta``)."""


class KeyedState(ABC):
    """Values by key, partitioned into key groups; see the module docstring.

    Example (the ``memory`` backend; ``pescheduler.state.open_state`` picks one)::

        from pescheduler.state import MemoryState, key_group

        state = MemoryState()
        state.put("car-7", 3)
        view = state.snapshot()           # consistent, O(key groups)
        state.put("car-7", 4)             # the view still reads 3
        g = key_group("car-7")
        assert dict(view.items(g)) == {"car-7": 3} and state.changed() == {g}
        moved = state.export_groups([g])  # what a rescale hands to the new owner
        other = MemoryState()
        other.import_groups(moved)
        assert other.get("car-7") == 4
    """

    backend = ""
    # get_many costs less per key than get (disk: one encode of the keys in a batch and one
    # multi-get): an operator that knows a batch's keys up front reads them so (operators/latest.py)
    reads_in_batches = False
    token = ""                          # this state object's id in :class:`Changes` (set by _track)
    _seq = 0                            # snapshots taken of it

    _carried: tuple = ()                # Changes of views let go unwritten since the last snapshot

    def _track(self) -> None:
        """Start numbering this state's snapshots (a backend's ``__init__`` calls it)."""
        self.token, self._seq, self._carried = uuid.uuid4().hex, 0, ()
        self._adopted: dict[int, Received] = {}     # groups such an import replaced since the snapshot (_replaced)

    def _replaced(self, group: int, received: Received | None = None) -> None:
        """Group ``group`` replaced whole since the snapshot (an import, a take, a drop): its
        :class:`Changes` name it in ``whole``, and in ``adopted`` when the last replacement was
        an import that kept what it came from (``received``: a rescale's part's bytes, a lazy
        restore's files)."""
        self._whole.add(group)
        if received is None:
            self._adopted.pop(group, None)
        else:
            self._adopted[group] = received

    def _changes(self, keys: set, whole: set) -> Changes:
        """The next snapshot's :class:`Changes`, carrying those of the views let go unwritten."""
        self._seq += 1
        with _CARRY:
            before, self._carried = self._carried, ()
        adopted, self._adopted = self._adopted, {}     # each of whole too (_replaced), cleared with it
        return Changes(self.token, self._seq, keys, whole, before, adopted=adopted)

    def _let_go(self, changes: Changes | None) -> None:
        """A view of this state is let go (any thread): its Changes, if no checkpoint's writer took
        them, go with the next snapshot's (with those they carried), at most :data:`CARRY_MAX`
        snapshots' worth: past that (checkpoints aborted again and again, or none taken at all, a
        rescale's snapshot now and then) they are dropped, and the next checkpoint misses a
        snapshot and writes its groups whole, as before. A key is never lost either way: the
        writer builds a delta only on an unbroken run of snapshot numbers."""
        if changes is None or changes.taken or changes.token != self.token:
            return
        with _CARRY:
            carried = (*self._carried, *changes.before, changes)
            changes.before = ()
            self._carried = carried if len(carried) <= CARRY_MAX else ()

    @abstractmethod
    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""

    @abstractmethod
    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` (marks its key group changed)."""

    @abstractmethod
    def delete(self, key: Any) -> None:
        """Forget ``key`` (no error when absent; marks its key group changed)."""

    @abstractmethod
    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` of one key group, as it is now (do not write while iterating)."""

    @abstractmethod
    def groups(self) -> list[int]:
        """The key groups holding at least one key, ascending."""

    @abstractmethod
    def snapshot(self) -> StateView:
        """A consistent view of the state now; :meth:`changed` starts again from here."""

    @abstractmethod
    def changed(self) -> set[int]:
        """Key groups written (put or delete) since the last :meth:`snapshot`."""

    @abstractmethod
    def drop_groups(self, groups: Iterable[int]) -> None:
        """Forget every key of ``groups`` (they moved to another owner)."""

    @abstractmethod
    def _put_group(self, group: int, entries: dict) -> None:
        """Replace ``group`` with ``entries`` (import's one step per group)."""

    def get_many(self, keys: list) -> list:
        """The values of ``keys`` (None where absent), in order: a backend reads them in one call
        where it can (``disk``: one multi-get)."""
        return [self.get(k) for k in keys]

    def write_many(self, puts: Iterable[tuple[Any, Any]], deletes: Iterable[Any] = ()) -> None:
        """Put every ``(key, value)`` of ``puts`` and delete ``deletes``: a backend writes them in
        one call where it can (``disk``: one write batch)."""
        for key, value in puts:
            self.put(key, value)
        for key in deletes:
            self.delete(key)

    def read(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``, for a caller that does not change it in place
        (``memory``: never a copy, even while a snapshot's view is live)."""
        return self.get(key, default)

    def delete_many(self, keys: Iterable[Any]) -> None:
        """Forget every key of ``keys`` (as :meth:`delete` each)."""
        self.write_many((), keys)

    def entries(self) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` of every key, groups in no particular order (do not write while
        iterating): a scan of the whole state without asking group by group."""
        for g in self.groups():
            yield from self.items(g)

    def writable(self) -> dict | None:
        """``{key: value}`` of the keys put since the last :meth:`snapshot` (and since the last
        rescale's take), the values being the objects the state holds, or None when the backend
        holds copies (``disk``).

        A keyed operator's per-tuple shortcut: a key found here needs no :meth:`put` after its
        value was changed in place (its group is already copied away from any view and marked
        changed), so the hot path is one dict lookup; a key not found is read and put back. A
        new dict after a snapshot (the old one is the view's changed keys: a write into it would
        change the checkpoint) and after a take (no value the take gave away is in it); emptied
        by delete, drop and import: ask for it once per batch, never keep it across a snapshot.
        """
        return None

    def export_groups(self, groups: Iterable[int] | None = None) -> dict[int, bytes]:
        """``{group: bytes}`` of ``groups`` as they are now (default: every non-empty one)."""
        chosen = self.groups() if groups is None else sorted(groups)
        return {g: pack_group(self.items(g)) for g in chosen}

    def take_groups(self, groups: Iterable[int]) -> dict[int, dict]:
        """Remove whole key groups and return their entries, unpacked (``{group: {key: value}}``):
        a rescale hands them to another instance and packs them off the PE's turn."""
        chosen = sorted(set(groups) & set(self.groups()))
        taken = {g: dict(self.items(g)) for g in chosen}
        self.drop_groups(chosen)
        return taken

    def import_groups(self, exported: dict[int, bytes | dict]) -> None:
        """Install whole key groups from :meth:`export_groups` (of any backend), replacing them; a
        group may also be given unpacked (``{key: value}``: a restore that applied deltas)."""
        for g, data in exported.items():
            if not 0 <= g < KEY_GROUPS:
                raise ValueError(f"key group {g} is outside 0..{KEY_GROUPS - 1}")
            self._put_group(g, data if type(data) is dict else unpack_group(data))

    def __len__(self) -> int:
        return sum(1 for g in self.groups() for _ in self.items(g))

    def close(self) -> None:
        """Release what the backend holds (files, memory)."""

"""What a KEYED operator's snapshot holds of its keyed state: whole key groups.

``{group: (a key of it, bytes)}`` (a :class:`GroupsSnapshot` packs them when
read): the bytes are :func:`pack_group`'s, the key stands for its group when a
rescale asks ``owns(key)`` (copies own whole key groups, so one key answers for
all of them). Splitting and merging snapshots
then select and join key groups; no key is visited.
"""

from __future__ import annotations

import functools
import pickle
import zlib
from array import array
from itertools import compress, islice, repeat
from operator import is_, itemgetter, not_
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping

from ..errors import CheckpointDamaged
from .base import (_PREPARE, KEY_GROUPS, PACK_CHUNK, KeyedState, StateView, keep_received, key_group, pack_group,
                   preparing, unpack_group)
from ..wire import _MASK, key_hash
from .incremental import GroupRef, GroupsSnapshot, empty

Groups = dict[int, tuple[Any, bytes]]


def snapshot_groups(state: KeyedState | StateView) -> Mapping[int, tuple[Any, bytes]]:
    """Every non-empty key group of ``state`` as it is now (or of a view an operator made of its
    own state: a memory window's panes): a view, packed only when read (O(key groups) here; a
    checkpoint writes it from a worker thread, incremental.py)."""
    return GroupsSnapshot(state if isinstance(state, StateView) else state.snapshot())


def restore_groups(state: KeyedState, groups: Groups) -> None:
    """Make ``state`` hold exactly a snapshot's key groups."""
    state.drop_groups(state.groups())
    add_groups(state, groups)


def take_groups(state: KeyedState, groups: frozenset[int]) -> Groups:
    """Key groups ``groups`` taken out of ``state`` in a snapshot's form, for a rescale's
    ``export_groups``: packed only when the part is pickled, off the PE's turn."""
    return {g: (_first_key(entries), PackedOnPickle(entries, g)) for g, entries in state.take_groups(groups).items()}


def _first_key(entries: Mapping) -> Any:
    """A key of a taken group, without reading the rest (``memory.TakenGroup.first_key``)."""
    first = getattr(entries, "first_key", None)
    return first() if first is not None else next(iter(entries))


def add_groups(state: KeyedState, groups: Groups) -> None:
    """Another instance's key groups (:func:`take_groups`, a snapshot's) join ``state``: an ``import_groups``."""
    state.import_groups({g: data for g, (_key, data) in groups.items()})


class PackedOnPickle:
    """A key group's entries that become :func:`pack_group`'s bytes when pickled (they unpickle
    as those bytes, or within :func:`loads_prepared` as what its ``prepare`` makes of them): a
    rescale exports groups in the PE's turn and packs them later, off it."""

    def __init__(self, entries: dict, group: int) -> None:
        self.entries, self.group = entries, group

    def __reduce__(self):
        own = getattr(self.entries, "packed", None)     # a backend's own form (disk: its stored bytes)
        if own is not None:
            return own()
        return _unpickled, (self.group, pack_group(self.entries.items()))


def _unpickled(group: int, packed: bytes) -> Any:
    """A :class:`PackedOnPickle` unpickled: its bytes, or made ready for a store (loads_prepared),
    keeping them (a full file's form) for the receiving state's next checkpoint."""
    prepare = _PREPARE.get()
    if prepare is None:
        return packed
    return keep_received(prepare(group, unpack_group(packed)), lambda: packed)


def loads_prepared(blob: bytes, prepare: Callable[[int, dict], Any]) -> Any:
    """``pickle.loads(blob)`` with each exported key group in it unpacked and made ready for the
    receiving store by ``prepare(group, entries)`` (the backend's ``prepare_group``), here, in the
    calling thread: a rescale's part is imported between the PE's turns as a restored group is
    (``worker/lazy_restore.py``), the turn only installing it. Unpacking a part of 312,000 keys in
    the turn held a PE 370-420 ms at a time after a Release at 10^7 keys (traced), the collector
    visiting each new container."""
    with preparing(prepare, received=True):
        return pickle.loads(blob)


def split_groups(groups: Groups, owns: Callable[[Any], bool]) -> Groups:
    """The key groups whose keys ``owns``."""
    return {g: kd for g, kd in groups.items() if owns(kd[0])}


def merge_groups(parts: list[Groups]) -> Groups:
    """Every part's key groups (parts own disjoint groups). A checkpoint's view merged with key
    groups a lazy restore has not loaded yet (only :class:`GroupRef` entries: ``worker/
    lazy_restore.py``) stays a view, those groups joined as references: nothing is packed."""
    views = [p for p in parts if type(p) is GroupsSnapshot and p._packed is None]
    if len(views) == 1 and all(p is views[0] or _references(p) for p in parts):
        return views[0].joined({g: kd for p in parts if p is not views[0] for g, kd in p.items()})
    out: Groups = {}
    for part in parts:
        out.update(part)
    return out


def _references(part: Any) -> bool:
    """Is ``part`` a dict of key groups that are all file references (a checkpoint's, unread)?"""
    return type(part) is dict and all(type(kd[1]) is GroupRef for kd in part.values())


def key_groups(keys: list) -> list[int]:
    """``[key_group(k) for k in keys]`` in one batch: the per-key part (a crc) in Python, the mix
    over all of them in numpy (about a third of ``key_group``'s cost per key; numpy optional,
    imported at the first batch large enough to use it)."""
    np = _numpy() if len(keys) >= 64 else None
    if np is None:
        return [key_group(k) for k in keys]
    return _group_array(np, keys).tolist()


def parted(items: list, keys: Iterable, groups: Collection[int]) -> tuple[list, list]:
    """``items`` parted by their ``keys``' groups (``keys[i]`` of ``items[i]``): those in
    ``groups`` and the others, each in their order, every key's group computed once, in a batch
    (:func:`key_groups`). A rescale's ``export_groups`` takes the waiting tuples of the groups
    leaving in the PE's turn: a comprehension for each side computing every tuple's group took
    6.7 ms for 5,600 tuples, this 1.6."""
    if not items:
        return [], items
    inside = [g in groups for g in key_groups(list(keys))]
    return list(compress(items, inside)), list(compress(items, map(not_, inside)))


def group_bytes(keys: list) -> bytes:
    """:func:`key_groups` as bytes, a group a byte (``KEY_GROUPS`` is 128): not a container the
    cyclic collector visits, where a list of them is one it visits item by item while young
    (``memory._Fold._grouping`` keeps them from a snapshot to its fold)."""
    np = _numpy() if len(keys) >= 64 else None
    if np is None:
        return bytes(key_groups(keys))
    return _group_array(np, keys).astype(np.uint8).tobytes()


def _group_array(np: Any, keys: list) -> Any:
    """:func:`key_groups` of a non-empty list as a numpy array of uint64."""
    h = _int_hashes(np, keys) if type(keys[0]) is int else None
    if h is None:
        crc = zlib.crc32
        h = np.array([k & _MASK if type(k) is int else crc(k.encode()) if type(k) is str else key_hash(k)
                      for k in keys], dtype=np.uint64)
    s, c1, c2 = np.uint64(33), np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> s                         # wire.key_group's murmur3 fmix64, modulo 2**64 by the dtype
    h *= c1
    h ^= h >> s
    h *= c2
    h ^= h >> s
    return h % np.uint64(KEY_GROUPS)


def split_by_group(items: list, groups: Any) -> dict[int, list]:
    """``items`` by their key groups (``groups[i]`` of ``items[i]``: a list, or bytes of groups),
    each group's in their order: ``{group: [item, ...]}``. A checkpoint's writer sorts the keys
    changed since the last one by group; a ``setdefault`` and an ``append`` per key in Python
    held the GIL beside the PE for each of them. Here numpy's stable argsort orders them and
    ``map`` gathers them, in C: a slice per group is the only Python step."""
    np = _numpy() if len(items) >= 64 else None
    if np is None:
        out: dict[int, list] = {}
        for item, g in zip(items, groups):
            out.setdefault(g, []).append(item)
        return out
    at = np.frombuffer(groups, np.uint8) if type(groups) is bytes else np.asarray(groups, dtype=np.intp)
    order = np.argsort(at, kind="stable")
    ordered = list(map(items.__getitem__, order.tolist()))
    at = at[order]
    cuts = (np.flatnonzero(at[1:] != at[:-1]) + 1).tolist()
    return {g: ordered[a:b] for g, a, b in zip(at[[0, *cuts]].tolist(), [0, *cuts], [*cuts, len(ordered)])}


def _int_hashes(np: Any, keys: list) -> Any:
    """``k & _MASK`` of every key as uint64 when every key is an int of 64 bits (bools and
    numpy's ints too: ``key_hash`` takes them as the int they equal), numpy converting the
    list in C (the per-key Python expression was two thirds of a fold's key groups); None
    when a key is anything else (numpy then makes floats, text, objects or no array)."""
    try:
        ints = np.array(keys)
    except (ValueError, TypeError, OverflowError):
        return None
    if ints.ndim != 1 or ints.dtype.kind not in "ib":
        return None
    return ints.astype(np.uint64)       # two's complement: a negative int's ``k & _MASK``


@functools.cache
def _numpy() -> Any:
    try:
        import numpy
    except ImportError:                 # pragma: no cover - numpy is optional
        return None
    return numpy


class GroupMemo:
    """``key -> key group``, remembered: ``key_group`` costs ~0.8 us (a crc and a mix), a dict
    lookup ~0.06 us, and a keyed operator asks for the same keys at every snapshot or write."""

    def __init__(self) -> None:
        self._of: dict = {}

    def __call__(self, key: Any) -> int:
        g = self._of.get(key)
        if g is None:
            g = self._of[key] = key_group(key)
        return g

    def forget(self, key: Any) -> None:
        self._of.pop(key, None)

    def prune(self, live: int) -> None:
        """Start again when it holds more than twice the ``live`` keys (keys gone for good)."""
        if len(self._of) > 2 * live + 1024:
            self._of.clear()


def pack_namespaced(tables: dict, group_of: GroupMemo) -> Groups:
    """``{namespace: {key: value}}`` (a window's panes) as whole key groups.

    A group's bytes hold ``{namespace: (positions, {key: value})}``, a key's position being
    its place in its namespace's dict, so :func:`unpack_namespaced` gives the keys back in
    the order they were first seen. Packing is the copy (values are pickled). Hot loop: one
    pass over every entry, the memo read inline (a method call per key doubled it); measured
    faster than the copy of every slot list it replaces (bench/state.py part 2).
    """
    out: dict[int, dict] = {}
    live, memo, group = 0, group_of._of, key_group
    for ns, table in tables.items():
        live += len(table)
        places: list[list] = [[] for _ in range(KEY_GROUPS)]
        entries: list[dict] = [{} for _ in range(KEY_GROUPS)]
        for pos, (key, value) in enumerate(table.items()):
            g = memo.get(key)
            if g is None:
                g = memo[key] = group(key)
            places[g].append(pos)
            entries[g][key] = value
        for g, mine in enumerate(entries):
            if mine:
                out.setdefault(g, {})[ns] = (places[g], mine)
    group_of.prune(live)
    return {g: (next(iter(next(iter(per_ns.values()))[1])), pickle.dumps(per_ns, pickle.HIGHEST_PROTOCOL))
            for g, per_ns in sorted(out.items())}


class NamespacedOnPickle:
    """A key group of namespaced tables (``{namespace: (positions, {key: value})}``, as
    :func:`pack_namespaced` packs it) that becomes those bytes when pickled: a rescale takes a
    window's groups out in the PE's turn (:func:`take_namespaced`) and they are pickled later, off
    it, a chunk of keys per pickle (:func:`pack_namespaced_chunks`). :func:`unpack_namespaced`
    reads either form. A subclass may make ``per_ns`` when first read (a memory window's
    ``TakenPane``)."""

    __slots__ = ("per_ns",)

    def __init__(self, per_ns: dict) -> None:
        self.per_ns = per_ns

    def __reduce__(self):
        return bytes, (pack_namespaced_chunks(self.per_ns),)


def take_namespaced(tables: dict, groups: frozenset[int], group_of: GroupMemo) -> Groups:
    """The entries of key groups ``groups`` taken out of ``{namespace: {key: value}}`` (a window's
    panes; a namespace left empty goes), as :func:`pack_namespaced`'s groups whose bytes are made
    when pickled (:class:`NamespacedOnPickle`): no pickling in the caller's turn. One pass over
    the keys (the memo read in a comprehension; the keys not in it grouped in one batch,
    ``key_groups``), then the moving entries popped in the namespace's order (popped in group
    order they missed the cache at each: twice the time at 10^6 keys). A key's position is its
    place in its namespace's dict, as :func:`pack_namespaced`'s."""
    memo = group_of._of
    out: dict[int, dict] = {}
    for ns in list(tables):
        table = tables[ns]
        missing = [k for k in table if k not in memo]
        if missing:
            memo.update(zip(missing, key_groups(missing)))
        moving = [(pos, k, g) for pos, k in enumerate(table) if (g := memo[k]) in groups]
        if not moving:
            continue
        pop = table.pop
        for pos, k, g in moving:
            places, entries = out.setdefault(g, {}).setdefault(ns, ([], {}))
            places.append(pos)
            entries[k] = pop(k)
        if not table:
            del tables[ns]
    return {g: (next(iter(next(iter(per_ns.values()))[1])), NamespacedOnPickle(per_ns))
            for g, per_ns in sorted(out.items())}


def unpack_namespaced(groups: Groups) -> dict:
    """The ``{namespace: {key: value}}`` of :func:`pack_namespaced`, namespaces ascending; keys of
    several snapshots (a merge) that had the same position keep their groups' order."""
    by_ns: dict = {}
    for _g, (_key, data) in sorted(groups.items()):
        for ns, part in _per_ns(data).items():
            by_ns.setdefault(ns, []).append(part)
    out = {}
    for ns in sorted(by_ns):
        parts = by_ns[ns]
        out[ns] = parts[0][1] if len(parts) == 1 else _in_place_order(parts)
    return out


class ChunkedEntries:
    """One key group's entries of one namespace as :func:`pack_namespaced_chunks` pickles them,
    made a slice at a time (a memory window's pick: ``pane_index.pick_groups``): dicts of at most
    :data:`PACK_CHUNK` keys in their order, their positions (``array("q")``), and the slots of
    keys a later layer replaced (``over``). A group's keys in one dict, as the pick made them
    before, cost a resize of that dict now and then (at 10^7 keys, 128 of them at 43,691 keys
    each, 4-18 ms each holding the GIL), a copy a chunk at a time to pickle them, and a ``del``
    of 78,000 entries in one C call."""

    __slots__ = ("places", "chunks", "over")

    def __init__(self) -> None:
        self.places = array("q")
        self.chunks: list[dict] = [{}]
        self.over: dict = {}

    def append(self, keys: list, values: list, places: Any) -> None:
        """``keys`` new to the group, after those it has, at ``places`` (ints in order: a list, or
        an int64 array of numpy)."""
        if type(places) is list:
            self.places.extend(places)
        else:
            self.places.frombytes(places.tobytes())
        i = 0
        while i < len(keys):
            room = PACK_CHUNK - len(self.chunks[-1])
            if not room:
                self.chunks.append({})
                room = PACK_CHUNK
            self.chunks[-1].update(zip(keys[i:i + room], values[i:i + room]))
            i += room

    @classmethod
    def of(cls, places: list, entries: dict) -> "ChunkedEntries":
        """``pane_groups``' ``(positions, {key: slots})`` of a group, chunked (a slice at a time)."""
        out, it = cls(), iter(entries.items())
        for start in range(0, len(places), PACK_CHUNK):
            keys, values = zip(*islice(it, PACK_CHUNK))
            out.append(keys, values, places[start:start + PACK_CHUNK])
        return out

    @classmethod
    def chunked(cls, entry: "ChunkedEntries | tuple[list, dict]") -> "ChunkedEntries":
        """``entry`` as it is, or a ``(positions, {key: slots})`` group chunked by :meth:`of`."""
        return entry if type(entry) is cls else cls.of(*entry)

    def replace(self, keys: list, values: list) -> None:
        """Newer slots of ``keys`` the group has: each keeps its place."""
        self.over.update(zip(keys, values))

    def __len__(self) -> int:
        return len(self.places)

    def first(self) -> Any:
        return next(iter(self.chunks[0]))

    def taken(self) -> Iterator[tuple[list, dict]]:
        """Each chunk's positions and entries (newest slots), the chunk let go once given: a
        checkpoint's writer takes a group once, and what it packed is freed a chunk at a time."""
        over, chunks, start = self.over, self.chunks, 0
        chunks.reverse()
        while chunks:
            chunk = chunks.pop()
            if not chunk:
                continue
            if over and (replaced := chunk.keys() & over.keys()):
                chunk.update(zip(replaced, map(over.__getitem__, replaced)))
            yield self.places[start:start + len(chunk)].tolist(), chunk
            start += len(chunk)
            del chunk
        empty(over)                     # a slice at a time, as the chunks went


def pack_namespaced_chunks(per_ns: dict) -> bytes:
    """One group's ``{namespace: (positions, {key: value})}`` (chunked: :meth:`ChunkedEntries.chunked`)
    or ``{namespace: ChunkedEntries}`` (taken) as pickles of at most :data:`PACK_CHUNK` entries each, one after the other (a checkpoint's
    writer pickles a group of 78,000 keys at 10^7 keys: one call would hold the GIL that long).
    A namespace's first chunk is under its own name, the next ones under ``(namespace, i)``, so
    the pickles read one after the other into one dict (``unpack_group``) lose none;
    :func:`unpack_namespaced` joins them."""
    parts = []
    for ns, entry in per_ns.items():
        for i, (at, chunk) in enumerate(ChunkedEntries.chunked(entry).taken()):
            parts.append(pickle.dumps({ns if i == 0 else (ns, i): (at, chunk)}, pickle.HIGHEST_PROTOCOL))
    return b"".join(parts) if parts else pickle.dumps({}, pickle.HIGHEST_PROTOCOL)    # (a group left empty)


# A memory window's delta of a key group (operators/pane_layers.py, ``PanesView.delta``), entries
# beside its full file's chunks once a restore applied it (``incremental.read_group``):
DELTA_SET = "="     # (pane start, DELTA_SET, key): slots, of a key the chain's files hold
DELTA_NEW = "+"     # (pane start, DELTA_NEW, key): (its place in the pane's merged order, slots)
DELTA_DROP = "-"    # (pane start, DELTA_DROP): None, the pane was dropped


class PickledDelta:
    """A memory window's delta of one group pickled as its view read it (``PanesView._deltas_of``:
    the slots change in place once the view is read): its length is the keys it puts (the
    checkpoint's writer weighs chains in keys); pickled in its delta file as those bytes, it
    unpickles as the pair any delta does, ``(puts, deleted keys)`` (as ``disk.RawDelta``)."""

    __slots__ = ("data", "puts")

    def __init__(self, data: bytes, puts: int) -> None:
        self.data, self.puts = data, puts

    def __len__(self) -> int:
        return self.puts

    def __reduce__(self):
        return _unpickled_delta, (self.data,)


def _unpickled_delta(data: bytes) -> tuple[dict, list]:
    return pickle.loads(data), []


def _per_ns(data: Any) -> Mapping:
    """One group's ``{namespace: (positions, {key: value})}``: from its bytes (one pickle, or
    :func:`pack_namespaced_chunks`'), from a rescale's group not pickled yet (its ``per_ns``), or
    as a restore read it (unpickled: a lazy restore's ``PreparedEntries``, an eager one's dict;
    with a memory window's deltas applied: :func:`_apply_deltas`)."""
    if isinstance(data, NamespacedOnPickle):    # a rescale's group not pickled yet
        return data.per_ns
    read = data if isinstance(data, Mapping) else unpack_group(data)
    if not any(type(ns) is tuple for ns in read):
        return read
    chunks = [ns for ns in read if type(ns) is not tuple or type(ns[1]) is int]
    out: dict = {}
    for ns in sorted(chunks, key=lambda ns: (ns, 0) if type(ns) is not tuple else ns):
        places, entries = read[ns]
        name = ns[0] if type(ns) is tuple else ns
        if name in out:
            out[name][0].extend(places)
            out[name][1].update(entries)
        else:
            out[name] = (list(places), dict(entries))
    if len(chunks) < len(read):
        _apply_deltas(out, read, [name for name in read if type(name) is tuple and type(name[1]) is not int])
    return out


def _apply_deltas(out: dict, read: Mapping, names: list) -> None:
    """A memory window's deltas (``names``, in the order their files were applied) onto the
    group's panes ``out``: a key held, its slots replaced in place; a key new since, appended at
    its place (the places of the new keys of one pane ascend, after every place held); a pane
    dropped, gone (a dropped pane never comes back within a chain: the watermark only goes back
    at an import or a restore, and the snapshot after either writes every group whole)."""
    new: dict = {}
    dropped = set()
    for name in names:
        ns, tag = name[0], name[1]
        if tag == DELTA_DROP:
            dropped.add(ns)
            continue
        key, held = name[2], out.get(ns)
        if held is not None and key in held[1]:
            held[1][key] = read[name] if tag == DELTA_SET else read[name][1]
            continue
        added = new.setdefault(ns, {})
        if tag == DELTA_NEW:
            added[key] = read[name]
        elif key in added:
            added[key] = (added[key][0], read[name])
        else:
            raise CheckpointDamaged(f"a window's delta changes key {key!r} of pane {ns!r}, which its "
                                    f"group's earlier files do not hold")
    for ns, added in new.items():
        places, entries = out.setdefault(ns, ([], {}))
        for key, (place, slots) in sorted(added.items(), key=lambda kv: kv[1][0]):
            places.append(place)
            entries[key] = slots
    for ns in dropped:
        out.pop(ns, None)


def _in_place_order(parts: list) -> dict:
    """One namespace's entries from several groups, each put back at its position (one pass, no
    sort); positions repeat only in a merge of several snapshots: then a stable sort."""
    slots: list = [None] * (max(places[-1] for places, _ in parts) + 1)
    for places, mine in parts:
        for pos, kv in zip(places, mine.items()):
            if slots[pos] is not None:
                placed = [e for places, mine in parts for e in zip(places, mine.items())]
                placed.sort(key=_first)
                return dict(map(_second, placed))
            slots[pos] = kv
    return dict(filter(None, slots))


_first, _second = itemgetter(0), itemgetter(1)


def rewrite(state: Any, change: Callable[[Any], Any]) -> None:
    """Every value of ``state`` through ``change``, which returns its argument when nothing
    changed and something empty when the key is to go: one pass over the key groups, then one
    write of what changed (a query leaving an operator, an expiry sweep): no write between two
    groups read, so the memory backend folds nothing during the sweep (a fold per group was part
    of why the ep_patterns and ep_over sweeps ran 0.3-0.5x their dicts)."""
    puts, deletes = [], []
    for g in state.groups():
        for k, value in state.items(g):
            new = change(value)
            if new is not value:
                if new:
                    puts.append((k, new))
                else:
                    deletes.append(k)
    if puts or deletes:
        state.write_many(puts, deletes)


def write_batch(state: KeyedState, now: dict, gone: Any = None) -> None:
    """A batch's writes, gathered by an operator in ``now`` (key -> its value after the batch,
    ``gone`` for a key deleted), in one :meth:`KeyedState.write_many`: the operator pays a dict
    store per tuple instead of a backend call (on memory a put is a Python call with three
    stores; write_many three dict updates in C). ``now`` is emptied of the deleted keys."""
    if not now:
        return
    deleted = [key for key, value in now.items() if value is gone] if any(map(is_, now.values(), repeat(gone))) else ()
    for key in deleted:
        del now[key]
    state.write_many(now.items(), deleted)

"""A memory time window's panes at a checkpoint: frozen as layers and packed off the PE's loop.

A time window on the ``memory`` backend keeps its panes as its own dicts (``{pane start: {key:
slots}}``, slots changed in place by the fold: ``window.py``). Its snapshot packed every pane's
keys into key groups in the PE's turn (``pack_namespaced``), so the stream stopped at every
checkpoint for a time that grew with the keys held: 5-9 / 73-134 / 1,289-2,032 ms at 10^4 / 10^5
/ 10^6 keys in one pane (``bench/ckpt_stall.py --op window``). Now a snapshot only freezes the
panes' dicts as they are and puts an empty dict on top of each; the checkpoint's writer packs the
frozen ones in its thread (:class:`PanesView`), as a ``memory`` keyed state's view is written::

    pane p:   top (the fold writes it)   over   older layers, newest first (frozen while a view lives)

    snapshot ──> no view live: the top absorbed by the newest older layer (``dict.update``: the
                 keys put since the last snapshot), a small layer by the one under it; then
                 every pane's layers frozen as they are, an empty top: O(panes) and O(keys put
                 since the last snapshot), never O(keys held)
                 a view live (the last checkpoint is still being written): the top pushed as
                 one more layer
    fold     ──> a key not in the top is looked for in the older layers: while a view lives its
                 slots are copied into the top (the writer may be reading them), else changed
                 where they are
    writer   ──> the layers read in their merged order (``merged_items``) and packed by key
                 group, a slice at a time, no dict of the pane's size built (one resize of a
                 dict of 10^6 keys holds the GIL 25 ms, of 10^7 0.8 s)
    fire     ──> a pane read the same way, which firing reads whole anyway
    export   ──> a rescale's: every pane's layers taken as they are, O(panes); the moving
                 groups' entries read from them when the part is pickled (``TakenPanes``), and
                 hidden here (``Left``) until the next checkpoint's writer has read them and
                 pops them (``purge``)
    own      ──> a query's change rewrites slots in place: the layers merged into the top
                 (copied while a view lives)

Merged order: keys in the order they were first seen (the oldest layer's first), each with its
newest slots, as ``dict.update`` of the layers oldest first would give.

A view is live from the snapshot until it is released (written, or packed for a rescale); while
any is, the fold copies (:meth:`PaneLayers.copier`). The slots' copy is ``list(slots)`` when every
aggregate's accumulator is a value (built-ins with inline code: ``count``, ``sum``, ``min``...),
else a deep copy (a collection or sketch is changed in place by its ``update``).
"""

from __future__ import annotations

import pickle
import threading
import time
import uuid
import weakref
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

from pescheduler.state import KEY_GROUPS, key_group
from pescheduler.state.base import Changes, StateView
from pescheduler.state.groups import NamespacedOnPickle, key_groups, pack_namespaced_chunks, unpack_namespaced
from pescheduler.state.memory import LEAVE_KEYS, LEAVE_PACE_S
from pescheduler.worker.gc_pause import gc_paused

SLICE = 4096        # entries the writer groups per numpy call, then it pauses (LEAVE_PACE_S, as memory's leave thread)
ABSORB = 4          # a layer at most 1/ABSORB of the one under it is absorbed by it (size-tiered)
MAX_LAYERS = 4      # ... and any top-most one past this many


def slot_copier(plan: Any) -> Callable[[list], list]:
    """How the fold copies a frozen key's slots: ``list`` when every accumulator is an immutable
    value (each aggregate updates by an inline expression that returns a new one), else a deep
    copy (a pickle round trip: a set, a Counter, a sketch is changed in place)."""
    if all(node.aggregate.update_src is not None for node in plan.slots):
        return list
    return lambda slots: pickle.loads(pickle.dumps(slots, pickle.HIGHEST_PROTOCOL))


def merged_items(layers: tuple[dict, ...]) -> Iterator[tuple[Any, Any]]:
    """``(key, slots)`` of a pane's layers (newest first) in merged order, without building it."""
    if len(layers) == 1:
        yield from layers[0].items()
        return
    oldest_first = layers[::-1]
    for i, layer in enumerate(oldest_first):
        below, above = oldest_first[:i], layers[:len(layers) - 1 - i]     # above: newest first
        for k, s in layer.items():
            if below and any(k in d for d in below):
                continue                # placed where an older layer first saw it
            for d in above:
                newer = d.get(k)
                if newer is not None:
                    s = newer
                    break
            yield k, s


class PaneLayers:
    """The older layers of a memory window's panes and the views that froze them; the top layer
    stays the window's ``_panes`` (what the fold writes). See the module docstring."""

    def __init__(self) -> None:
        self.older: dict[Any, tuple[dict, ...]] = {}    # pane start -> layers under the top, newest first
        self._live: set[int] = set()                    # ids of the views not yet released
        self._token = f"panes-{uuid.uuid4().hex}"       # the views' Changes (every group whole each time)
        self._seq = 0
        self._init_purge()

    def _init_purge(self) -> None:
        # The keys an export hid (``Left``) leave their dicts after a checkpoint's writer has
        # read them (:meth:`purge`), a slice at a time, only while nothing else iterates those
        # dicts: no other view lives (another checkpoint, a part not read yet) and the PE is not
        # firing from them (``_reading``). Those come and go under ``_lock``, and each slice is
        # popped holding it.
        self._lock = threading.Lock()
        self._reading = 0
        self._purging = False
        self._hidden: list[Left] = []                   # layers some keys left, not purged yet

    def copier(self, copy: Callable[[list], list]) -> Callable[[list], list] | None:
        """What the fold copies a frozen key's slots with: ``copy`` while a view lives, else None."""
        return copy if self._live else None

    def freeze(self, top: dict) -> "PanesView":
        """A snapshot: each pane's layers frozen under an empty top (see the module docstring)."""
        with self._lock:                # a view becomes live: the purge must not pop meanwhile
            return self._freeze(top)

    def _freeze(self, top: dict) -> "PanesView":
        live, frozen = bool(self._live), {}
        for p, d in top.items():
            held = self.older.get(p, ())
            if held and any(type(layer) is Left and layer.purged for layer in held):
                held = self.older[p] = tuple(layer.layer if type(layer) is Left and layer.purged else layer
                                             for layer in held)
            if held and not live and type(held[0]) is dict:    # nobody reads them: the window's own
                if d:
                    held[0].update(d)
                    top[p] = {}
                held = self.older[p] = _compacted(held)
            elif d:
                held = self.older[p] = (d, *held)
                top[p] = {}
            if held:
                frozen[p] = held
        self._seq += 1
        changes = Changes(self._token, self._seq, (), set(range(KEY_GROUPS)))
        return PanesView(frozen, changes, self._live, self.purge)

    def items(self, top: dict, p: Any) -> Iterable[tuple[Any, Any]]:
        """Pane ``p``'s ``(key, slots)`` in merged order, to fire it."""
        held = self.older.get(p)
        return top[p].items() if not held else self._reading_while(merged_items((top[p], *held)))

    def _reading_while(self, items: Iterator) -> Iterator:
        """``items``, the purge held off until they are read (or the iterator dropped)."""
        with self._lock:
            self._reading += 1
        try:
            yield from items
        finally:
            with self._lock:
                self._reading -= 1

    def own(self, top: dict, copy: Callable[[list], list]) -> None:
        """Every pane in its top alone, its slots the window's own (a query's change rewrites
        them in place): its layers merged into the oldest (in C: ``_flat``), or, while a view
        lives, into a new dict of copied slots."""
        with self._lock:
            live = bool(self._live)
            for p, held in self.older.items():
                layers = (top[p], *held)
                top[p] = {k: copy(s) for k, s in merged_items(layers)} if live else _flat(layers)
            self.older.clear()

    def export(self, top: dict, groups: frozenset[int], memo: dict) -> "TakenPanes":
        """A rescale takes key groups ``groups``: O(panes) in the PE's turn. Every pane's top is
        pushed onto its layers, and the layers are taken as they are (:class:`TakenPanes`: the
        moving groups' entries read from them off the turn, when the part is pickled) and kept
        here behind :class:`Left`, which hides the keys of ``groups`` (``memo``: the window's
        key -> group). The taken layers count as a live view until read."""
        taken = {}
        with self._lock:
            for p, d in top.items():
                held = self.older.get(p, ())
                if d:
                    held = (d, *held)
                    top[p] = {}
                if held:
                    taken[p] = held
                    self.older[p] = hiding = tuple(Left(layer, groups, memo) for layer in held)
                    self._hidden += hiding
            part = TakenPanes(taken, groups, self._live)
        return part

    def purge(self, reader: int) -> None:
        """In a checkpoint's writer thread, once view ``reader`` is packed: the keys an export hid
        popped from their layers (found a slice at a time: nobody changes a hidden layer's size;
        popped a slice at a time while no other reader iterates it), each layer then ``purged``
        (the next snapshot reads it as a plain dict). A layer left unfinished waits for the next
        checkpoint."""
        with self._lock:
            if self._purging:
                return
            self._purging = True
        try:
            while self._hidden:
                layer = self._hidden[0]
                gone, it, keys = layer.groups, iter(layer.layer), []
                while part := list(islice(it, SLICE)):
                    keys += [k for k, g in zip(part, key_groups(part)) if g in gone]
                    time.sleep(LEAVE_PACE_S)
                for i in range(0, len(keys), LEAVE_KEYS):
                    with self._lock:
                        if self._reading or self._live - {reader}:
                            return
                        pop = layer.layer.pop
                        for k in keys[i:i + LEAVE_KEYS]:
                            pop(k, None)
                    time.sleep(LEAVE_PACE_S)
                layer.purged = True
                with self._lock:
                    if self._hidden and self._hidden[0] is layer:
                        self._hidden.pop(0)
        finally:
            self._purging = False

    def drop(self, p: Any) -> None:
        self.older.pop(p, None)

    def clear(self) -> None:
        """The panes were replaced whole (a restore): no layer of theirs is left."""
        self.older.clear()
        with self._lock:
            self._hidden = []

    def __getstate__(self) -> dict:          # views are not pickled with the operator, nor the purge
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_reading", "_purging", "_hidden")}
        return {**state, "_live": set()}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_purge()


def _flat(layers: tuple[dict, ...]) -> dict:
    """A pane's layers (newest first, none read by a view) as one dict in merged order, in C: the
    oldest (the largest) updated with the others, oldest first (``dict.update`` keeps a key's
    place and takes its newer slots); through ``merged_items`` when some keys left a layer."""
    if any(type(layer) is Left for layer in layers):
        return dict(merged_items(layers))
    base = layers[-1]
    for layer in reversed(layers[:-1]):
        base.update(layer)
    return base


def _compacted(held: tuple[dict, ...]) -> tuple[dict, ...]:
    """Layers (newest first, none read by a view) with each small one absorbed by the one under
    it, and the top-most ones past :data:`MAX_LAYERS`: a pane that lived through checkpoints
    written while the next began (each pushing a layer) keeps a few. An absorb costs the upper
    layer's keys (put while a view lived), never the pane's."""
    while len(held) > 1 and type(held[0]) is type(held[1]) is dict and \
            (len(held) > MAX_LAYERS or len(held[0]) * ABSORB <= len(held[1])):
        held[1].update(held[0])
        held = held[1:]
    return held


class Left:
    """A frozen layer some of whose keys left with a rescale (key groups ``groups``): read as the
    layer without them (``get``, ``in``, ``items``: the fold's lookup, a firing, a checkpoint).
    The keys stay in the dict, hidden, until the pane is dropped: taking them out would be a
    pass over the pane in the turn, the pause this avoids. A key's group is looked up in the
    window's memo (added when missing), in the PE's thread and the writer's."""

    __slots__ = ("layer", "groups", "memo", "purged")

    def __init__(self, layer: "dict | Left", groups: frozenset[int], memo: dict) -> None:
        if type(layer) is Left:
            layer, groups = layer.layer, layer.groups | groups
        self.layer, self.groups, self.memo = layer, groups, memo
        self.purged = False                 # its hidden keys popped (the purge): a plain dict again

    def get(self, key: Any, default: Any = None) -> Any:
        value = self.layer.get(key)
        if value is None:
            return default
        g = self.memo.get(key)
        if g is None:
            g = self.memo[key] = key_group(key)
        return default if g in self.groups else value

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None

    def items(self) -> Iterator[tuple[Any, Any]]:
        gone, it = self.groups, iter(self.layer.items())
        while part := list(islice(it, SLICE)):
            for (k, s), g in zip(part, key_groups([k for k, _ in part])):
                if g not in gone:
                    yield k, s


class TakenPanes:
    """A rescale's moving key groups, as the pane layers they were taken with (:meth:`PaneLayers.
    export`): read in one pass, by the first :class:`TakenPane` pickled (off the PE's turn: the
    hand-over pickles a part in a thread), each key at its place in its pane's merged order, as
    ``take_namespaced`` placed it. A live view until then: the window copies the slots it folds."""

    def __init__(self, taken: dict[Any, tuple], groups: frozenset[int], live: set[int]) -> None:
        self._taken, self.groups = taken, groups
        self._per_group: dict[int, dict] | None = None
        self._lock = threading.Lock()
        live.add(id(self))
        self._end = weakref.finalize(self, live.discard, id(self))

    def per_ns(self, group: int) -> dict:
        with self._lock:
            if self._per_group is None:
                self._per_group = gc_paused(self._read)
                self._taken = {}
                self._end()
        return self._per_group.get(group, {})

    def _read(self) -> dict[int, dict]:
        out: dict[int, dict] = {}
        moving = self.groups
        for p in sorted(self._taken):
            pos = 0
            it = merged_items(self._taken[p])
            while part := list(islice(it, SLICE)):
                for (k, s), g in zip(part, key_groups([k for k, _ in part])):
                    if g in moving:
                        places, entries = out.setdefault(g, {}).setdefault(p, ([], {}))
                        places.append(pos)
                        entries[k] = s
                    pos += 1
                time.sleep(LEAVE_PACE_S)
        return out


class TakenPane(NamespacedOnPickle):
    """One moving key group of :class:`TakenPanes`: a ``NamespacedOnPickle`` whose ``{pane start:
    (positions, {key: slots})}`` is read from the taken layers when first asked for."""

    __slots__ = ("taken", "group")

    def __init__(self, taken: TakenPanes, group: int) -> None:
        self.taken, self.group = taken, group

    @property
    def per_ns(self) -> dict:
        return self.taken.per_ns(self.group)


_REPRESENTATIVE: list[int] = []


def representative(group: int) -> int:
    """An int key of key group ``group`` (the smallest): a part names each of its groups by a
    key (``split_groups`` asks ``owns(key)``), and the moving keys are not read in the turn."""
    if not _REPRESENTATIVE:
        found: dict[int, int] = {}
        i = 0
        while len(found) < KEY_GROUPS:
            found.setdefault(key_group(i), i)
            i += 1
        _REPRESENTATIVE.extend(found[g] for g in range(KEY_GROUPS))
    return _REPRESENTATIVE[group]


class PanesView(StateView):
    """A memory window's frozen panes as a checkpoint's key groups: each group's
    ``{pane start: (positions, {key: slots})}`` (``pack_namespaced``'s), pickled a chunk at a time
    (``pack_namespaced_chunks``) in the reader's thread; every group is written whole (a window's
    panes turn over)."""

    def __init__(self, frozen: dict[Any, tuple[dict, ...]], changes: Changes, live: set[int],
                 purge: Callable[[int], None] = lambda reader: None) -> None:
        self._frozen, self.changes, self._purge = frozen, changes, purge
        self._packed: dict[int, tuple[bytes, int, Any]] | None = None
        self._lock = threading.Lock()
        live.add(id(self))
        self._end = weakref.finalize(self, live.discard, id(self))

    def _groups(self) -> dict[int, tuple[bytes, int, Any]]:
        with self._lock:
            if self._packed is None:        # allocation-heavy and acyclic: no collection meanwhile
                self._packed = gc_paused(self._pack)
            return self._packed

    def _pack(self) -> dict[int, tuple[bytes, int, Any]]:
        """Each pane's keys in merged order, grouped a slice at a time (``key_groups``: numpy),
        each group pickled once."""
        per_group: dict[int, dict] = {}
        for p in sorted(self._frozen):
            places: list[list] = [[] for _ in range(KEY_GROUPS)]
            entries: list[dict] = [{} for _ in range(KEY_GROUPS)]
            pos = 0
            it = merged_items(self._frozen[p])
            while part := list(islice(it, SLICE)):
                for (k, s), g in zip(part, key_groups([k for k, _ in part])):
                    places[g].append(pos)
                    entries[g][k] = s
                    pos += 1
                time.sleep(LEAVE_PACE_S)    # the PE's thread, waiting for the GIL, has it now
            for g, mine in enumerate(entries):
                if mine:
                    per_group.setdefault(g, {})[p] = (places[g], mine)
        out = {}
        for g in sorted(per_group):
            per_ns = per_group[g]
            first = next(iter(next(iter(per_ns.values()))[1]))
            out[g] = (pack_namespaced_chunks(per_ns), sum(len(e) for _, e in per_ns.values()), first)
            time.sleep(LEAVE_PACE_S)
        self._frozen = {}
        return out

    def groups(self) -> list[int]:
        return sorted(self._groups())

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        """``(pane start, (positions, {key: slots}))`` of one group (what its bytes hold)."""
        data = self._groups().get(group)
        return iter(unpack_namespaced({group: (data[2], data[0])}).items()) if data else iter(())

    def full(self, group: int) -> tuple[bytes, int, Any]:
        """A checkpoint's file of one group; the first call, in the checkpoint's writer thread,
        lets the keys a rescale hid leave their layers (``PaneLayers.purge``), paced."""
        packed = self._groups()
        purge, self._purge = self._purge, None
        if purge is not None:
            purge(id(self))
        return packed[group]

    def group_snapshot(self, group: int) -> tuple[Any, bytes]:
        data, _count, first = self._groups()[group]
        return first, data

    def by_group(self, keys: Iterable[Any]) -> dict[int, list]:
        return {}                       # no key is tracked: every group is written whole

    def delta(self, group: int, keys: Iterable[Any]) -> tuple[dict, list]:
        raise NotImplementedError("a window's panes are written whole at every checkpoint")

    def release(self) -> None:
        self._end()

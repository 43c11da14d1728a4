"""A memory time window's panes at a checkpoint: frozen as layers and packed off the PE's loop.

A time window on the ``memory`` backend keeps its panes as its own dicts (``{pane start: {key:
slots}}``, slots changed in place by the fold: ``window.py``). Its snapshot packed every pane's
keys into key groups in the PE's turn (``pack_namespaced``), so the stream stopped at every
checkpoint for a time that grew with the keys held: 5-9 / 73-134 / 1,289-2,032 ms at 10^4 / 10^5
/ 10^6 keys in one pane (``bench/ckpt_stall.py --op window``). Now a snapshot only freezes the
panes' dicts as they are and puts an empty dict on top of each; the checkpoint's writer packs the
frozen ones in its thread (:class:`PanesView`), as a ``memory`` keyed state's view is written::

    pane p:   top (the fold writes it)   over   older layers, newest first (frozen while a view lives)

    snapshot ──> every pane's top pushed as one more layer and the layers frozen as they are,
                 an empty top: O(panes), never O(keys held) nor O(keys put since the last one)
    fold     ──> a key not in the top is looked for in the older layers: while a view lives its
                 slots are copied into the top (the writer may be reading them), else changed
                 where they are
    writer   ──> the layers read by key group in their merged order (``pane_index.py``: an
                 index of each pane's keys by group, then the groups the writer rewrites whole
                 picked; ``pane_groups`` for layers not plain dicts) and packed, a slice at a
                 time, no dict of the pane's size built (one resize of a
                 dict of 10^6 keys holds the GIL 25 ms, of 10^7 0.8 s); the view is then no
                 longer live, and the writer tidies the layers (``tidy``): the keys an export hid
                 popped, small layers absorbed by the ones under them, a slice at a time, while
                 nothing else reads them (what is left, the next checkpoint's writer goes on with)
    fire     ──> a pane read the same way, which firing reads whole anyway
    export   ──> a rescale's: every pane's layers taken as they are, O(panes); the moving
                 groups' entries read from them when the part is pickled (``TakenPanes``), and
                 hidden here (``Left``) until the next checkpoint's writer has read them and
                 pops them (``tidy``)
    own      ──> a query's change rewrites slots in place: the layers merged into the top
                 (copied while a view lives)
    delta    ──> once a checkpoint's writer has read a view (``tracking``), the fold puts a frozen
                 key into the top on first touch always (copied while a view lives, else its slots
                 as they are), so each snapshot's pushed tops are the keys changed since the one
                 before (``PaneKeys``): its checkpoint writes those and the panes dropped as
                 deltas of their key groups, pickled while the view lives (``PanesView.delta``),
                 not every key of the panes. Whole again after an export, an import, a query's change, a
                 restore, or when a snapshot between went unwritten (``Changes.one_step``)

Merged order: keys in the order they were first seen (the oldest layer's first), each with its
newest slots, as ``dict.update`` of the layers oldest first would give.

A view is live from the snapshot until it is read (packed for a checkpoint or a rescale); while
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
from pescheduler.state.groups import (DELTA_DROP, DELTA_NEW, DELTA_SET, ChunkedEntries, NamespacedOnPickle, PickledDelta,
                                     key_groups, pack_namespaced_chunks, unpack_namespaced)
from pescheduler.state.memory import LEAVE_KEYS, LEAVE_PACE_S
from pescheduler.worker.gc_pause import gc_held, gc_paused

from .pane_index import OldestGroups, PaneIndex, index_pane, indexable, pick_groups

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


def pane_groups(layers: tuple[dict, ...], wanted: frozenset[int] | None = None) -> tuple[dict[int, tuple[list, dict]], int]:
    """One pane's layers (newest first) by key group, ``{group: (positions, {key: slots})}`` as
    ``pack_namespaced`` makes them: each key at its place in the merged order with its newest
    slots; only the groups ``wanted`` (None: all), the positions counting every key; and how
    many keys the pane holds (the place after the last). Read oldest
    layer first, a slice at a time (``key_groups``: numpy), each later layer's slots put over
    the older ones' (as ``dict.update`` puts them): a key of the oldest, largest layer costs no
    lookup elsewhere (through ``merged_items`` it cost one in each newer layer, a cache miss
    each: 1.90-2.07 s against 1.46-1.55 for 10^6 keys under 10^5 copied, in process)."""
    want = [wanted is None or g in wanted for g in range(KEY_GROUPS)]
    places: list[list] = [[] for _ in range(KEY_GROUPS)]
    entries: list[dict] = [{} for _ in range(KEY_GROUPS)]
    oldest_first = layers[::-1]
    pos = 0
    for i, layer in enumerate(oldest_first):
        below = oldest_first[:i]
        only = below[0] if len(below) == 1 else None
        it = iter(layer.items())
        while part := list(islice(it, SLICE)):
            for (k, s), g in zip(part, key_groups([k for k, _ in part])):
                if below and (k in only if only is not None else any(k in d for d in below)):
                    if want[g]:
                        entries[g][k] = s       # newer slots, the place an older layer gave it
                    continue
                if want[g]:
                    places[g].append(pos)
                    entries[g][k] = s
                pos += 1
            time.sleep(LEAVE_PACE_S)    # the PE's thread, waiting for the GIL, has it now
    return {g: (places[g], mine) for g, mine in enumerate(entries) if mine}, pos


DROPPED = object()      # PaneKeys' key of a pane dropped: (pane start, DROPPED)
_EMPTY = pickle.dumps({}, pickle.HIGHEST_PROTOCOL)


class PaneKeys:
    """One snapshot's ``Changes.keys`` of a memory window: ``(pane start, key)`` of every key the
    fold put into a pane's top since the snapshot before (the tops it pushed, read in the
    checkpoint's writer, off the PE's loop), and ``(pane start, DROPPED)`` of each pane dropped
    meanwhile. The pushed tops are frozen layers: nothing changes them while a view lives."""

    __slots__ = ("pushed", "dropped")

    def __init__(self, pushed: dict, dropped: list) -> None:
        self.pushed, self.dropped = pushed, dropped

    def __len__(self) -> int:
        return sum(map(len, self.pushed.values())) + len(self.dropped)

    def __iter__(self) -> Iterator[tuple]:
        for p, d in self.pushed.items():
            for k in d:
                yield p, k
        for p in self.dropped:
            yield p, DROPPED


class PaneLayers:
    """The older layers of a memory window's panes and the views that froze them; the top layer
    stays the window's ``_panes`` (what the fold writes). See the module docstring."""

    def __init__(self) -> None:
        self.older: dict[Any, tuple[dict, ...]] = {}    # pane start -> layers under the top, newest first
        self._live: set[int] = set()                    # ids of the views not yet released
        self._token = f"panes-{uuid.uuid4().hex}"       # the views' Changes
        self._seq = 0
        self._tracking = False      # a checkpoint's writer read a view: the fold copies into the top always
        self._init_tidy()

    def _init_tidy(self) -> None:
        # A checkpoint's writer changes the frozen dicts once it has read them (:meth:`tidy`), a
        # slice at a time, only while nothing else iterates them: no other view lives (another
        # checkpoint, a part not read yet) and the PE is not firing from them (``_reading``).
        # Those come and go under ``_lock``, and each slice is changed holding it.
        self._lock = threading.Lock()
        self._reading = 0
        self._tidying = False
        self._hidden: list[Left] = []                   # layers some keys left, not purged yet
        self._whole = True          # the next snapshot writes every group whole (the first, or after a
                                    # change the tops do not hold: mark_whole)
        self._dropped: list = []    # panes dropped since the last snapshot (while tracking)
        self._oldest = OldestGroups()   # each pane's oldest layer's key groups, for the next writer

    def copier(self, copy: Callable[[list], list]) -> Callable[[list], list] | bool | None:
        """What the fold copies a frozen key's slots with: ``copy`` while a view lives; once a
        checkpoint's writer read one (``tracking``) and none lives, True: the slots themselves
        into the top, no copy (the next snapshot's top lists every key changed: its delta; a
        call of an identity function there cost the fold 10-15 %); else None (changed where
        they are)."""
        if self._live:
            return copy
        return True if self._tracking else None

    def track(self) -> None:
        """A checkpoint's writer reads a view whole (``PanesView.reads_whole``, while the view still
        lives: the fold copies meanwhile): from now on the fold puts a frozen key into the top on
        first touch (:meth:`copier`), so the tops hold every key changed since the last snapshot."""
        self._tracking = True

    def mark_whole(self) -> None:
        """The panes changed in a way their tops do not show (an export hid keys, an import added
        some at other places, a query's change, a restore): the next snapshot writes them whole."""
        self._whole = True

    def freeze(self, top: dict) -> "PanesView":
        """A snapshot: each pane's layers frozen under an empty top (see the module docstring)."""
        with self._lock:                # a view becomes live: the tidy must not change them meanwhile
            return self._freeze(top)

    def _freeze(self, top: dict) -> "PanesView":
        frozen, pushed = {}, {}
        for p, d in top.items():
            held = self.older.get(p, ())
            if held and any(type(layer) is Left and layer.purged for layer in held):
                held = self.older[p] = tuple(layer.layer if type(layer) is Left and layer.purged else layer
                                             for layer in held)
            if d:
                held = self.older[p] = (d, *held)
                pushed[p] = d
                top[p] = {}
            if held:
                frozen[p] = held
        self._oldest.keep_only(frozen)
        # A delta when the tops hold every change since the last snapshot: the fold copied into
        # them all along (tracking, turned on while the last view still lived) and nothing else
        # changed the panes (mark_whole).
        keys = None if self._whole or not self._tracking else PaneKeys(pushed, self._dropped)
        self._whole, self._dropped = False, []
        return PanesView(frozen, self._changes(keys), self._live, self.tidy, pushed, self.track, self._oldest)

    def _changes(self, keys: "PaneKeys | None" = None) -> Changes:
        """The next view's: its keys changed since the last snapshot, or every group whole."""
        self._seq += 1
        if keys is None:
            return Changes(self._token, self._seq, (), set(range(KEY_GROUPS)))
        return Changes(self._token, self._seq, keys, set(), one_step=True)

    def freeze_made(self, make: Callable[[], dict]) -> "PanesView":
        """A snapshot of panes the window keeps in another form (a columnar window's arrays,
        copied: ``ColumnarPanes.frozen``): ``make()`` gives ``{pane start: rows}`` in the reader's
        thread, ``rows.items()`` its ``(key, slots)`` in merged order. Nothing here is frozen: the
        fold copies nothing for it."""
        return PanesView(make, self._changes(), set())

    def items(self, top: dict, p: Any) -> Iterable[tuple[Any, Any]]:
        """Pane ``p``'s ``(key, slots)`` in merged order, to fire it."""
        held = self.older.get(p)
        return top[p].items() if not held else self._reading_while(merged_items((top[p], *held)))

    def _reading_while(self, items: Iterator) -> Iterator:
        """``items``, the tidy held off until they are read (or the iterator dropped)."""
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
            self.mark_whole()
            self._oldest.clear()
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
        self.mark_whole()
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

    def tidy(self, reader: int) -> None:
        """In a checkpoint's writer thread, once view ``reader`` is packed: the keys an export hid
        leave their layers (:meth:`_purge`), then each pane's layers are absorbed into fewer
        (:meth:`_absorb`). Both change the frozen dicts only while nothing else iterates them (no
        other view or part lives, the PE is not firing): checked under ``_lock`` before each
        slice; what is left unfinished waits for the next checkpoint's writer."""
        with self._lock:
            if self._tidying:
                return
            self._tidying = True
        try:
            if self._purge(reader):
                self._absorb(reader)
        finally:
            self._tidying = False

    def _others(self, reader: int) -> bool:
        """Whether anything but ``reader`` may be iterating the layers (under ``_lock``)."""
        return bool(self._reading or self._live - {reader})

    def _purge(self, reader: int) -> bool:
        """The keys an export hid popped from their layers (found a slice at a time: nobody
        changes a hidden layer's size; popped a slice at a time), each layer then ``purged`` (the
        next snapshot reads it as a plain dict). False when stopped by another reader."""
        while self._hidden:
            layer = self._hidden[0]
            gone, it, keys = layer.groups, iter(layer.layer), []
            self._oldest.forget_layer(layer.layer)      # (its order changes: keys popped)
            while part := list(islice(it, SLICE)):
                keys += [k for k, g in zip(part, key_groups(part)) if g in gone]
                time.sleep(LEAVE_PACE_S)
            for i in range(0, len(keys), LEAVE_KEYS):
                with self._lock:
                    if self._others(reader):
                        return False
                    pop = layer.layer.pop
                    for k in keys[i:i + LEAVE_KEYS]:
                        pop(k, None)
                time.sleep(LEAVE_PACE_S)
            layer.purged = True
            with self._lock:
                if self._hidden and self._hidden[0] is layer:
                    self._hidden.pop(0)
        return True

    def _absorb(self, reader: int) -> None:
        """Each pane's layers made fewer, off the PE's turn (absorbed at the snapshot, the keys
        copied while a checkpoint of 10^7 keys was written stopped the stream 284-322 ms): a
        plain layer absorbed by the plain one under it when at most 1/:data:`ABSORB` of its size,
        or past :data:`MAX_LAYERS` (size-tiered), its entries put there a slice at a time
        (``dict.update``: a key keeps the lower one's place and takes the upper one's slots, so
        the merged order is the same before, during and after), then the upper one dropped from
        the pane's layers. The fold reads either meanwhile: both hold the same slots."""
        for p in list(self.older):
            while True:
                with self._lock:
                    held = self.older.get(p, ())
                    pair = next(((upper, lower) for upper, lower in zip(held, held[1:])
                                 if type(upper) is type(lower) is dict
                                 and (len(held) > MAX_LAYERS or len(upper) * ABSORB <= len(lower))), None)
                if pair is None:
                    break
                upper, lower = pair
                it = iter(upper.items())    # the upper's size does not change: only the fold reads it
                for _ in range(0, len(upper), SLICE):
                    with self._lock:
                        held = self.older.get(p, ())
                        if self._others(reader):
                            return
                        if not any(layer is upper for layer in held) or not any(layer is lower for layer in held):
                            break       # a query's change merged them, the pane dropped, an export hid keys
                        lower.update(islice(it, SLICE))
                    time.sleep(LEAVE_PACE_S)
                else:
                    with self._lock:
                        held = self.older.get(p, ())
                        if any(layer is lower for layer in held):
                            self.older[p] = tuple(layer for layer in held if layer is not upper)
                    continue
                break

    def drop(self, p: Any) -> None:
        self.older.pop(p, None)
        if self._tracking or self._live:    # (as the fold's copies: the next snapshot's delta drops it)
            self._dropped.append(p)

    def clear(self) -> None:
        """The panes were replaced whole (a restore): no layer of theirs is left."""
        self.older.clear()
        self.mark_whole()
        self._dropped = []
        self._oldest.clear()
        with self._lock:
            self._hidden = []

    def __getstate__(self) -> dict:          # views are not pickled with the operator, nor the tidy
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_reading", "_tidying", "_hidden", "_oldest")}
        return {**state, "_live": set()}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_tidy()


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
        self.purged = False                 # its hidden keys popped (the tidy): a plain dict again

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


class TakenGroups:
    """A rescale's moving key groups, read once, by the first :class:`TakenPane` pickled (off the
    PE's turn: the hand-over pickles a part in a thread), the GC paused: ``_read`` gives every
    group's ``{pane start: (positions, {key: slots})}``, ``_done`` lets go of what it read."""

    def __init__(self) -> None:
        self._per_group: dict[int, dict] | None = None
        self._lock = threading.Lock()

    def per_ns(self, group: int) -> dict:
        with self._lock:
            if self._per_group is None:
                self._per_group = gc_paused(self._read)
                self._done()
        return self._per_group.get(group, {})

    def _read(self) -> dict[int, dict]:
        raise NotImplementedError

    def _done(self) -> None:
        pass


class TakenPanes(TakenGroups):
    """A memory window's moving key groups, as the pane layers they were taken with
    (:meth:`PaneLayers.export`), each key at its place in its pane's merged order, as
    ``take_namespaced`` placed it. A live view until read: the window copies the slots it folds."""

    def __init__(self, taken: dict[Any, tuple], groups: frozenset[int], live: set[int]) -> None:
        super().__init__()
        self._taken, self.groups = taken, groups
        live.add(id(self))
        self._end = weakref.finalize(self, live.discard, id(self))

    def _done(self) -> None:
        self._taken = {}
        self._end()

    def _read(self) -> dict[int, dict]:
        out: dict[int, dict] = {}
        for p in sorted(self._taken):
            for g, placed in pane_groups(self._taken[p], self.groups)[0].items():
                out.setdefault(g, {})[p] = placed
        return out


class TakenPane(NamespacedOnPickle):
    """One moving key group of :class:`TakenPanes` (or a columnar window's ``TakenColumns``): a
    ``NamespacedOnPickle`` whose ``{pane start: (positions, {key: slots})}`` is read from what
    was taken when first asked for."""

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
    (``pack_namespaced_chunks``) in the reader's thread. Read in two steps while the view lives:
    the index (each pane's keys counted by group, ``pane_index.py``) and, for ``Changes.one_step``,
    the deltas; then the pack of the groups the writer reads whole (:meth:`reads_full`; all of
    them unless it said), and the view is no longer live."""

    def __init__(self, frozen: dict[Any, tuple[dict, ...]] | Callable[[], dict], changes: Changes,
                 live: set[int], tidy: Callable[[int], None] = lambda reader: None, pushed: dict | None = None,
                 track: Callable[[], None] = lambda: None, oldest: OldestGroups | None = None) -> None:
        self._frozen, self.changes, self._tidy, self._track = frozen, changes, tidy, track
        self._oldest = oldest or OldestGroups()
        self._packed: dict[int, tuple[bytes, int, Any]] | None = None
        self._wanted: frozenset[int] | None = None  # the groups to pack (reads_full; None: all)
        # pane start -> its index, or (layers not plain dicts) its groups read whole by pane_groups
        self._indexed: dict[Any, PaneIndex | dict] | None = None
        self._present: set[int] = set()             # the groups the panes hold a key of
        # for a delta (Changes.one_step): the panes' layers as frozen, the tops this snapshot
        # pushed, and each pane's keys new since the snapshot before with their places
        self._held = frozen if changes.one_step else None
        self._pushed, self._deltas = pushed or {}, {}
        self._counts: dict = {}             # pane start -> its keys, counted by the index
        self._lock = threading.Lock()
        live.add(id(self))
        self._end = weakref.finalize(self, live.discard, id(self))

    def _index(self) -> dict[Any, "PaneIndex | dict"]:
        """The index and the deltas, once (under ``_lock``): the view stays live."""
        if self._indexed is None:           # allocation-heavy and acyclic: no collection meanwhile
            self._indexed = gc_held(self._read)
        return self._indexed

    def _groups(self) -> dict[int, tuple[bytes, int, Any]]:
        with self._lock:
            if self._packed is None:
                self._index()
                self._packed = gc_held(self._pack)
                self._end()                 # read: the fold need not copy for this view any more
            return self._packed

    def _read(self) -> dict[Any, "PaneIndex | dict"]:
        """Each pane's index (its layers all plain dicts: ``pane_index.index_pane``) or its groups
        read whole (``pane_groups``), then (``Changes.one_step``) the deltas, while the view lives:
        no tidy puts the tops under meanwhile, the fold changes no slot of it."""
        if callable(self._frozen):          # panes read as rows here (PaneLayers.freeze_made)
            self._frozen = {p: (rows,) for p, rows in self._frozen().items()}
        indexed: dict[Any, PaneIndex | dict] = {}
        present = set()
        for p in sorted(self._frozen):
            layers = self._frozen[p]
            if indexable(layers):
                index = indexed[p] = index_pane(p, layers, self._oldest)
                self._counts[p] = index.count
                present.update(index.present.nonzero()[0].tolist())
            else:
                grouped, self._counts[p] = pane_groups(layers)
                indexed[p] = grouped
                present.update(grouped)
        self._present = present
        if self._held is not None:
            self._deltas = self._deltas_of()
        return indexed

    def reads_full(self, groups: Iterable[int]) -> None:
        """The only groups :meth:`full` may be asked for in this checkpoint (the others get deltas
        or are unchanged: ``ChainWriter._may_rewrite``): only they are packed, now, with the deltas
        (the view is then no longer live), and the layers tidied."""
        self._wanted = frozenset(groups)
        self._groups()
        self._tidied()

    def _pack(self) -> dict[int, tuple[bytes, int, Any]]:
        """Each pane's wanted groups (``pane_index.pick_groups``), each group pickled once."""
        wanted = None if self._wanted is None or self._present <= self._wanted else self._wanted
        per_group: dict[int, dict] = {}
        for p in sorted(self._indexed):
            made = self._indexed[p]
            if type(made) is PaneIndex:
                grouped = pick_groups(made, wanted)
            else:                           # (layers not plain dicts: read whole by pane_groups)
                grouped = made if wanted is None else {g: v for g, v in made.items() if g in wanted}
            for g, placed in grouped.items():
                per_group.setdefault(g, {})[p] = placed
            del grouped, made               # (held, the groups below were freed at the return: 90 ms)
        self._indexed = {}
        out = {}
        for g in sorted(per_group):
            per_ns = {p: ChunkedEntries.chunked(v) for p, v in per_group.pop(g).items()}    # a group at a time, a chunk at a time as packed
            first = next(iter(per_ns.values())).first()
            count = sum(map(len, per_ns.values()))
            out[g] = (pack_namespaced_chunks(per_ns), count, first)
            del per_ns
            time.sleep(LEAVE_PACE_S)
        self._frozen = {}
        return out

    def groups(self) -> list[int]:
        with self._lock:
            self._index()
            return sorted(self._present)

    def items(self, group: int) -> Iterator[tuple[Any, Any]]:
        """``(pane start, (positions, {key: slots}))`` of one group (what its bytes hold)."""
        data = self._groups().get(group)
        return iter(unpack_namespaced({group: (data[2], data[0])}).items()) if data else iter(())

    def full(self, group: int) -> tuple[bytes, int, Any]:
        """A checkpoint's file of one group (one :meth:`reads_full` named); the first call, in the
        checkpoint's writer thread, tidies the layers it read (``PaneLayers.tidy``: the keys a
        rescale hid leave, the layers absorbed into fewer), paced."""
        packed = self._groups()
        self._tidied()
        if group not in packed and self._wanted is not None and group not in self._wanted:
            raise RuntimeError(f"key group {group} of a window's panes was read whole but not named by "
                               f"reads_full ({sorted(self._wanted)}): its keys were not packed")
        return packed[group]

    def _tidied(self) -> None:
        tidy, self._tidy = self._tidy, None
        if tidy is not None:
            tidy(id(self))

    def reads_whole(self) -> None:
        """A checkpoint's writer reads this view whole (still live): the fold tracks its changes
        from now on, so the next snapshot's checkpoint can write deltas (``PaneLayers.track``)."""
        self._track()

    def group_snapshot(self, group: int) -> tuple[Any, bytes]:
        data, _count, first = self._groups()[group]
        return first, data

    def by_group(self, keys: Iterable[Any]) -> dict[int, list]:
        """``PaneKeys``' items by key group, a dropped pane's in every group."""
        keys = list(keys)
        dropped = [item for item in keys if item[1] is DROPPED]
        if dropped:
            keys = [item for item in keys if item[1] is not DROPPED]
        out: dict[int, list] = {}
        for item, g in zip(keys, key_groups([k for _, k in keys])):
            out.setdefault(g, []).append(item)
        for g in range(KEY_GROUPS) if dropped else ():
            out.setdefault(g, []).extend(dropped)
        return out

    def delta(self, group: int, keys: Iterable[Any]) -> tuple[Any, tuple]:
        """Group ``group``'s changes since the snapshot before (``Changes.one_step``; ``keys``, its
        ``PaneKeys`` items, were all read by the pack: :meth:`_deltas_of`), as
        ``groups._per_ns`` applies them to the chain's files."""
        with self._lock:
            self._index()
        return self._deltas.get(group) or PickledDelta(_EMPTY, 0), ()

    def _deltas_of(self) -> dict[int, "PickledDelta"]:
        """Every group's changes since the snapshot before, pickled while the view lives (once it
        does not, the fold changes slots where they are: ``PaneLayers.copier``): each key of a
        pushed top (the keys changed), by key group, its slots as the top holds them, under
        ``(pane start, DELTA_SET, key)`` when the panes held it then, else ``(pane start,
        DELTA_NEW, key)`` with its place in its pane's merged order (after every key held then);
        ``(pane start, DELTA_DROP)`` of a pane dropped, in every group. O(keys changed), a group
        a pickle, paced."""
        out: dict[int, dict] = {}
        for p, top in self._pushed.items():
            places, it = self._places(p), iter(top.items())
            while part := list(islice(it, SLICE)):
                for (k, slots), g in zip(part, key_groups([k for k, _ in part])):
                    place = places.get(k)
                    out.setdefault(g, {})[(p, DELTA_SET, k) if place is None else (p, DELTA_NEW, k)] = \
                        slots if place is None else (place, slots)
        for p in self.changes.keys.dropped:
            if p not in self._held:
                for g in range(KEY_GROUPS):
                    out.setdefault(g, {})[(p, DELTA_DROP)] = None
        deltas = {}
        for g in sorted(out):
            puts = out.pop(g)
            deltas[g] = PickledDelta(pickle.dumps(puts, pickle.HIGHEST_PROTOCOL), len(puts))
            if len(puts) > 256:
                time.sleep(LEAVE_PACE_S)
        return deltas

    def _places(self, p: Any) -> dict:
        """Pane ``p``'s keys new since the snapshot before, each with its place in the pane's
        merged order (after the keys held then: the pane's keys as the pack counted them, less
        the new ones); a pane that pushed nothing: none."""
        held, top = self._held[p], self._pushed.get(p)
        new = []
        if top is not None and held[0] is top:
            under = held[1:]
            only = under[0] if len(under) == 1 else None
            new = [k for k in top if not (k in only if only is not None else any(k in d for d in under))]
        base = self._counts[p] - len(new) if new else 0
        return dict(zip(new, range(base, base + len(new))))

    def release(self) -> None:
        """The view let go, its packed groups one at a time: freed together at the write's end
        (128 of 2.7 MB at 10^7 keys), they held the GIL 15-31 ms in ``munmap`` on glibc's malloc
        (perf). Nothing reads a view once released (``GroupsSnapshot`` keeps what it read)."""
        self._held = self._pushed = None
        self._deltas = {}
        self._end()
        packed = self._packed or {}
        while packed:
            packed.popitem()

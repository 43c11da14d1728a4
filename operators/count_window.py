"""Count windows: every ``count`` tuples of a key, tumbling or sliding, in event-time order.

``count_window(count, slide=None, aggregates={name: (function, field)})``
(``Stream.window(count=..., slide=...)``) emits one dict per key and window::

    {"car": "car-0042", "window_start": 1_000, "window_end": 1_950, "avg_speed": 13.9}

A window is exactly ``count`` consecutive tuples of one key; ``window_start``
is the first one's ``ts`` and ``window_end`` the last one's ``ts + 1`` (end
exclusive, like time windows). Tumbling (``slide=None``): windows do not
overlap. Sliding: a window of the last ``count`` tuples every ``slide``
tuples (``count`` a multiple of ``slide``), built from panes of ``slide``
tuples so each tuple is aggregated once. The first window of a key comes with
its ``count``-th tuple; tuples left over at the end of the stream (fewer than a
window) are not reported.

Order: "consecutive" means in event-time order, not arrival order. Tuples wait
until the watermark passes them and are then taken by ``ts`` (equal timestamps
in arrival order), so the result does not depend on how the stream was
shuffled within ``max_delay``. A window is new when its last tuple is taken;
rows come in that order. A tuple with ``ts <= watermark`` on arrival goes to the
``late`` side output; one that cannot be aggregated is dead-lettered alone.
A key's panes stay until the end of the stream (count windows never expire by
time).

State: each key's panes live in the deployment's keyed state backend
(``pescheduler.state``: memory or disk), so a snapshot holds whole key groups
and a rescale moves key groups (docs/state.md).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Iterable

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import Emitter, OperatorContext
from pescheduler.state import MemoryState
from pescheduler.state import adopt
from pescheduler.state.groups import (add_groups, merge_groups, restore_groups, snapshot_groups, split_groups,
                                     parted, take_groups, write_batch)

from .window import AggregatingWindow


class CountWindow(AggregatingWindow):
    """Tumbling or sliding windows of ``count`` tuples per key; see the module docstring."""

    name = "count_window"

    def __init__(self, count: int, slide: int | None = None, aggregates: dict | None = None,
                 key: str | Callable | None = None, ts_field: str = "ts",
                 queries: dict | None = None) -> None:
        self.count = count
        self.slide = count if slide is None else slide
        for what, n in (("count", count), ("slide", self.slide)):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"count window: {what} must be a positive number of tuples, got {n!r}")
        if self.count % self.slide:
            raise ValueError(f"count window: count ({count}) must be a multiple of slide ({slide}): "
                             f"sliding count windows are built from panes of slide tuples")
        self._pending: list = []            # tuples not yet passed by the watermark
        # key -> [full panes [(first_ts, slots)], current pane's first ts, tuples in it, its slots],
        # in memory until open() moves it to the deployment's backend (restore comes before open);
        # not closed by close(): a PE that finished can still be snapshotted for a Release, so a
        # disk store lives as long as this operator (removed when it is collected)
        self._keys = MemoryState()
        self._wm = MIN_WATERMARK
        self._init_aggregates(aggregates, queries, key, ts_field)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._keys = adopt(context, self._keys)

    def _slot_lists(self) -> Iterable[list]:
        """Every key's slot lists; each group's keys are put back once changed (a disk backend's
        values are copies; ``get`` copies a memory value a checkpoint's view may still be reading)."""
        keys = self._keys
        for g in keys.groups():
            entries = [(k, keys.get(k)) for k, _ in list(keys.items(g))]
            for _k, (panes, _first, _n, slots) in entries:
                yield from (s for _, s in panes)
                if slots is not None:
                    yield slots
            keys.write_many(entries)            # the group's keys in one call (disk: one write batch)

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        self._hold(batch, emit)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        """Hot loop (longer than ten lines on purpose): a key put since the last snapshot whose pane
        does not fill is folded here, in place, with one dict lookup and no call but the fold (the
        cost of a plain dict of panes); every other tuple goes through :meth:`_take`.

        On disk (values are copies, no ``writable()``) the released tuples' keys are read in one
        ``get_many`` and the batch's states written back in one ``write_many`` at its end
        (:func:`write_batch`): a Python call into the store per tuple (a get, then a put) was
        most of a disk window's cost; in between, a key's states are this batch's dict, changed in
        place as memory's ``writable()`` ones are."""
        ready = self._release(watermark)
        if not ready:
            return
        written = self._keys.writable()         # None on disk (copies): the batch's own dict
        batch = None if written is not None else self._read(ready)
        hot = written if batch is None else batch
        fold, last, out, dead = self._fold, self.slide - 1, emit.append, emit.dead_letter
        try:
            for ts, k, t in ready:
                try:                            # a fold that raises has changed nothing
                    state = hot.get(k)
                    if state is not None and state[2] < last:
                        slots = fold(state[3], t)
                        if state[2] == 0:
                            state[1] = ts
                        state[2] += 1
                        state[3] = slots
                    else:
                        self._take(k, ts, t, out, state, batch)
                except Exception as exc:
                    dead(t, exc)
        finally:
            if batch is not None:
                write_batch(self._keys, batch)

    def _read(self, ready: list) -> dict:
        """``{key: state}`` of the released tuples' keys the backend holds, in one ``get_many``."""
        keys = list(dict.fromkeys(k for _, k, _ in ready))
        return {k: state for k, state in zip(keys, self._keys.get_many(keys)) if state is not None}

    def _take(self, k: Any, ts: int, t: Any, out: Callable, state: list | None, batch: dict | None) -> None:
        """Fold ``t`` into its key's current pane (``state``: its writable value, else None: read
        from the backend and put back on memory; on disk ``batch`` already holds every key the
        backend had, so None is a new key, kept in ``batch``); a full pane may complete a window."""
        fresh = state is None
        if fresh and batch is None:
            state = self._keys.get(k)
        if state is None:
            state = [[], ts, 0, None]
            slots = self._fold(None, t)
        else:
            slots = self._fold(state[3], t)
        if state[2] == 0:
            state[1] = ts
        state[2] += 1
        state[3] = slots
        if state[2] < self.slide:
            if fresh:                           # inline, not a call: memory's path per new key
                if batch is None:
                    self._keys.put(k, state)
                else:
                    batch[k] = state
            return
        panes = state[0]
        panes.append((state[1], slots))
        state[2], state[3] = 0, None
        need = self.count // self.slide
        if len(panes) > need:
            del panes[0]
        if fresh:
            if batch is None:
                self._keys.put(k, state)
            else:
                batch[k] = state
        if len(panes) == need:
            merged = panes[0][1]
            for _, s in panes[1:]:
                merged = self._merge(merged, s)
            self._emit([(k, merged)], panes[0][0], ts + 1, out)

    # -- state --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Waiting tuples, the key groups of the keyed state (packed: a copy) and the watermark."""
        return {"layout": self.plan.layout, "count": self.count, "slide": self.slide,
                "watermark": self._wm, "pending": list(self._pending),
                "groups": snapshot_groups(self._keys)}

    def restore(self, state: dict) -> None:
        self._check_state(state, count=self.count, slide=self.slide)
        self._wm, self._pending = state["watermark"], list(state["pending"])
        restore_groups(self._keys, state["groups"])

    # -- copies: key groups move with their panes and waiting tuples ------------------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their
        panes and waiting tuples in :meth:`snapshot`'s form, removed here; the groups that stay
        are not read, and the moving ones are packed only when the part is pickled."""
        leaving, self._pending = parted(self._pending, map(itemgetter(1), self._pending), groups)
        return {"layout": self.plan.layout, "count": self.count, "slide": self.slide, "watermark": self._wm,
                "pending": leaving, "groups": take_groups(self._keys, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported (:meth:`export_groups`) join this running one;
        its own watermark stays (the tuples handed over wait for the next one)."""
        self._check_state(state, count=self.count, slide=self.slide)
        add_groups(self._keys, state["groups"])
        self._pending = sorted(self._pending + list(state["pending"]), key=itemgetter(0))

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(key)`` and their keys' waiting tuples."""
        return {**state, "pending": [p for p in state["pending"] if owns(p[1])],
                "groups": split_groups(state["groups"], owns)}

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups (disjoint) at the least advanced watermark."""
        return {**states[0], "watermark": min(s["watermark"] for s in states),
                "pending": sorted((p for s in states for p in s["pending"]), key=itemgetter(0)),
                "groups": merge_groups([s["groups"] for s in states])}

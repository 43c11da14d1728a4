"""Windows that slide with every event: one result per event, over the ``size`` before it.

``over_window(size, aggregates={name: (function, field)})``
(``Stream.window(size=..., slide="event")``, SQL's ``RANGE BETWEEN size
PRECEDING AND CURRENT ROW``) emits, for each event, one row over the events
of its key with ``ts`` in ``(event ts - size, event ts]``::

    {"car": "car-0042", "window_start": 1_501, "window_end": 2_001, "n": 480}

(``window_start = ts - size + 1``, ``window_end = ts + 1``, end exclusive like
every window here). This is the sliding window of continuous queries whose
result changes with each event (the JEPC aggregation), which panes of a
pane-based sliding window would make cost ``size / slide`` merges per result.
Here each event is folded in once and, when every aggregate is invertible
(``count``, ``sum``, ``sumsq`` and so ``avg``, ``var``, ``stddev``), taken
back out once when it leaves the window; otherwise (``min``, ``max``) a key's
window is refolded from its events when one leaves.

Order and equal timestamps: events wait until the watermark passes them and
are then taken in timestamp order, so results do not depend on arrival order
within ``max_delay``. Events of one key with the same ``ts`` are peers: each
sees all of them (one row per event, equal for peers). A new result is one
row per event, emitted when the event is taken. A tuple with
``ts <= watermark`` on arrival goes to the ``late`` side output; one that
cannot be aggregated is dead-lettered alone and is in no window.

A key that goes quiet keeps its last events until they are ``size`` behind
the watermark (swept at most once per ``size`` of event time).

State: each key's window (``[deque of (ts, tuple), slots]``) lives in the deployment's
keyed state backend (``pescheduler.state``: memory or disk, docs/state.md), so a
checkpoint holds whole key groups and a rescale moves key groups. A watermark reads a
key once and writes it once; on ``memory`` a key put since the last snapshot is changed
in place (``writable()``).
"""

from __future__ import annotations

from collections import deque
from itertools import groupby
from operator import itemgetter
from typing import Any, Callable, Iterable

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import Emitter, OperatorContext
from pescheduler.state import MemoryState, adopt
from pescheduler.state.groups import (add_groups, merge_groups, parted, restore_groups, snapshot_groups, split_groups,
                                     take_groups)
from pescheduler.timeutil import parse_duration

from .window import AggregatingWindow


class OverWindow(AggregatingWindow):
    """A row per event over the ``size`` ms up to it, per key; see the module docstring."""

    name = "over_window"

    def __init__(self, size: Any, aggregates: dict | None = None, key: str | Callable | None = None,
                 ts_field: str = "ts", queries: dict | None = None) -> None:
        self.size = parse_duration(size)
        if self.size <= 0:
            raise ValueError(f"over_window: size must be positive, got size={size!r}")
        self._pending: list = []               # (ts, key, tuple) not yet passed by the watermark
        # key -> [deque of (ts, tuple), slots]; in memory until open() moves it to the
        # deployment's backend (restore comes before open)
        self._keys = MemoryState()
        self._wm = MIN_WATERMARK
        self._swept = MIN_WATERMARK
        self._init_aggregates(aggregates, queries, key, ts_field)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._keys = adopt(context, self._keys)

    def _compile_state(self) -> None:
        super()._compile_state()
        self._subtract = self.plan.subtractor() if self.plan.invertible else None

    def _windows(self) -> Iterable[list]:
        """Every key's ``[window, slots]``; each group's keys are put back once changed (a disk
        backend's values are copies; ``get`` copies a memory value a view may still be reading)."""
        keys = self._keys
        for g in keys.groups():
            entries = [(k, keys.get(k)) for k, _ in list(keys.items(g))]
            yield from (state for _, state in entries)
            keys.write_many(entries)

    def _slot_lists(self) -> Iterable[list]:
        return (state[1] for state in self._windows())

    def windows(self) -> dict:
        """``{key: [(ts, tuple), ...]}`` of the keys holding events (a copy: for tests and
        inspection, not the hot path)."""
        return {k: list(w) for k, (w, _) in self._keys.entries()}

    def add_query(self, query_id: Any, aggregates: dict) -> None:
        """Start ``query_id``; aggregates new to the plan are folded from each key's window.

        A pane-based window lets a new aggregate start empty and report only the windows it
        saw whole (``window.py``); here a key's window moves with every event and a busy key
        is never empty, so that would mean no row for it ever. The window's events are kept,
        so the new slots are made complete at once: from its first row on, the query sees
        the whole window, as a query whose aggregates the plan had already does. (A key
        whose events the new aggregate cannot take stays as it was: no row for that query
        until its window has emptied.)
        """
        super().add_query(query_id, aggregates)
        self._complete(self._windows())

    def _complete(self, states: Iterable[list]) -> None:
        """Fold each key's ``[window, slots]`` again where its slots lack the plan's newest
        aggregates (changed in place; a window an aggregate cannot take stays as it was)."""
        n = len(self.plan.slots)
        for state in states:
            window, slots = state
            if slots is not None and len(slots) == n:
                continue
            full = None
            try:
                for _, t in window:
                    full = self._fold(full, t)
            except Exception:
                continue
            state[1] = full

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        self._hold(batch, emit)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        """Each key's window is read once (not at all when put since the snapshot, on memory:
        changed in place; on disk every key in one ``get_many``) and written back once, after the
        watermark's events (one ``write_many``)."""
        ready = self._release(watermark)
        written = self._keys.writable()         # None on disk (copies): every key is put back
        hot = {} if written is None else written
        read = {} if written is not None else self._read(ready)     # disk: one get_many
        for ts, step in groupby(ready, itemgetter(0)):
            peers: dict[Any, list] = {}
            for _, k, t in step:
                peers.setdefault(k, []).append(t)
            for k, events in peers.items():
                state = hot.get(k)
                if state is None:
                    state = read.get(k)
                    if state is None:
                        state = read[k] = self._keys.get(k) or [deque(), None]
                self._slide(k, state, ts, events, emit)
                if not state[0] and k in hot:
                    self._keys.delete(k)
        if read:
            self._keys.write_many(((k, s) for k, s in read.items() if s[0]),
                                  [k for k, s in read.items() if not s[0]])
        if watermark - self._swept >= self.size:
            self._sweep(watermark)

    def _read(self, ready: list) -> dict:
        """``{key: [window, slots]}`` of every key of ``ready``, read in one ``get_many`` (a new key:
        an empty window): on disk a call into the store per key was most of a watermark's cost."""
        keys = list(dict.fromkeys(k for _, k, _ in ready))
        return {k: state or [deque(), None] for k, state in zip(keys, self._keys.get_many(keys))}

    def _step(self, k: Any, ts: int, events: list, emit: Emitter) -> None:
        """:meth:`_slide` of one key read from the state and written back (ep_over's refolding lanes)."""
        state = self._keys.get(k) or [deque(), None]
        self._slide(k, state, ts, events, emit)
        if state[0]:
            self._keys.put(k, state)
        else:
            self._keys.delete(k)

    def _slide(self, k: Any, state: list, ts: int, events: list, emit: Emitter) -> None:
        """Slide key ``k``'s window (``state``, changed in place) to end at ``ts``, fold in
        ``events``, emit a row for each."""
        window, slots = state
        refold = self._evict(window, slots, ts - self.size)
        if refold:
            slots = None
            for _, old in window:
                slots = self._fold(slots, old)
        slots, taken = fold_in(self._fold, slots, window, ts, events, emit)
        state[1] = slots
        if not window:
            return
        out = emit.append
        for _ in range(taken):
            self._emit([(k, slots)], ts - self.size + 1, ts + 1, out)

    def _evict(self, window: deque, slots: list | None, bound: int) -> bool:
        """Drop events with ``ts <= bound``; True when the rest must be refolded (not invertible)."""
        subtract, gone = self._subtract, False
        while window and window[0][0] <= bound:
            _, old = window.popleft()
            if subtract is not None:
                subtract(slots, old)
            gone = True
        return gone and subtract is None

    def _sweep(self, watermark: int) -> None:
        """Forget keys whose every event is ``size`` behind the watermark: no future row sees them."""
        self._swept = watermark
        bound, keys = watermark - self.size, self._keys
        quiet = [k for k, (window, _) in keys.entries() if window[-1][0] <= bound]
        keys.write_many((), quiet)

    # -- state: each key's window, in whole key groups ------------------------------------
    def snapshot(self) -> dict:
        """Waiting tuples, the key groups of the keyed state (packed when read: a copy), the
        watermark."""
        return {"layout": self.plan.layout, "size": self.size, "watermark": self._wm,
                "swept": self._swept, "pending": list(self._pending), "groups": snapshot_groups(self._keys)}

    def restore(self, state: dict) -> None:
        self._check_state(state, size=self.size)
        self._wm, self._swept, self._pending = state["watermark"], state["swept"], list(state["pending"])
        if "groups" in state:
            restore_groups(self._keys, state["groups"])
            return
        self._keys.drop_groups(self._keys.groups())     # a checkpoint from before the keyed state backend
        self._keys.write_many(((k, [deque(w), list(s)]) for k, w, s in state["keys"]))

    # -- copies: key groups move with their windows and waiting tuples -----------------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their
        windows and waiting tuples in :meth:`snapshot`'s form, removed here, the windows packed
        only when the part is pickled."""
        leaving, self._pending = parted(self._pending, map(itemgetter(1), self._pending), groups)
        return {"layout": self.plan.layout, "size": self.size, "watermark": self._wm, "swept": self._swept,
                "pending": leaving, "groups": take_groups(self._keys, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported join this running one; its own watermark stays
        (the tuples handed over wait for the next one)."""
        self._check_state(state, size=self.size)
        add_groups(self._keys, state["groups"])
        self._pending = sorted(self._pending + list(state["pending"]), key=itemgetter(0))

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(key)`` and their keys' waiting tuples (a checkpoint of
        the old per-key form: its keys)."""
        mine = {**state, "pending": [p for p in state["pending"] if owns(p[1])]}
        if "groups" in state:
            mine["groups"] = split_groups(state["groups"], owns)
        else:
            mine["keys"] = [entry for entry in state["keys"] if owns(entry[0])]
        return mine

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups (disjoint) at the least advanced watermark."""
        merged = {**states[0], "watermark": min(s["watermark"] for s in states),
                  "swept": min(s["swept"] for s in states),
                  "pending": sorted((p for s in states for p in s["pending"]), key=itemgetter(0))}
        if all("groups" in s for s in states):
            merged["groups"] = merge_groups([s["groups"] for s in states])
        elif any("groups" in s for s in states):
            raise ValueError("over_window: cannot merge a per-key checkpoint with a key-group one")
        else:
            merged["keys"] = [entry for s in states for entry in s["keys"]]
        return merged


def fold_in(fold: Callable, slots: list | None, window: deque, ts: int, events: list,
            emit: Emitter) -> tuple[list | None, int]:
    """Fold ``events`` (all at ``ts``) into ``slots`` and append them to ``window``; an event the
    fold raises on is dead-lettered (the fold changes nothing then). Returns the slots and how many
    events were taken (a row each). Shared by the over window and ep_over's lanes."""
    taken = 0
    for t in events:
        try:
            slots = fold(slots, t)
        except Exception as exc:
            emit.dead_letter(t, exc)
            continue
        window.append((ts, t))
        taken += 1
    return slots, taken

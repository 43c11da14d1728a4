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
"""

from __future__ import annotations

from collections import deque
from itertools import groupby
from operator import itemgetter
from typing import Any, Callable, Iterable

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import Emitter
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
        self._keys: dict[Any, list] = {}       # key -> [deque of (ts, tuple), slots]
        self._wm = MIN_WATERMARK
        self._swept = MIN_WATERMARK
        self._init_aggregates(aggregates, queries, key, ts_field)

    def _compile_state(self) -> None:
        super()._compile_state()
        self._subtract = self.plan.subtractor() if self.plan.invertible else None

    def _slot_lists(self) -> Iterable[list]:
        return (state[1] for state in self._keys.values())

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
        n = len(self.plan.slots)
        for state in self._keys.values():
            window, slots = state
            if len(slots) == n:
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
        for ts, step in groupby(self._release(watermark), itemgetter(0)):
            peers: dict[Any, list] = {}
            for _, k, t in step:
                peers.setdefault(k, []).append(t)
            for k, events in peers.items():
                self._step(k, ts, events, emit)
        if watermark - self._swept >= self.size:
            self._sweep(watermark)

    def _step(self, k: Any, ts: int, events: list, emit: Emitter) -> None:
        """Slide key ``k``'s window to end at ``ts``, fold in ``events``, emit a row for each."""
        state = self._keys.get(k)
        window, slots = state if state is not None else (deque(), None)
        refold = self._evict(window, slots, ts - self.size)
        if refold:
            slots = None
            for _, old in window:
                slots = self._fold(slots, old)
        taken = []
        for t in events:
            try:
                slots = self._fold(slots, t)
            except Exception as exc:            # fold changes nothing when it raises
                emit.dead_letter(t, exc)
                continue
            window.append((ts, t))
            taken.append(t)
        if not window:
            self._keys.pop(k, None)
            return
        self._keys[k] = [window, slots]
        out = emit.append
        for _ in taken:
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
        bound = watermark - self.size
        for k in [k for k, (window, _) in self._keys.items() if window[-1][0] <= bound]:
            del self._keys[k]

    # -- state --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Waiting tuples, each key's window events and slots (copied), the watermark."""
        return {"layout": self.plan.layout, "size": self.size, "watermark": self._wm,
                "swept": self._swept, "pending": list(self._pending),
                "keys": [(k, list(w), list(s)) for k, (w, s) in self._keys.items()]}

    def restore(self, state: dict) -> None:
        self._check_state(state, size=self.size)
        self._wm, self._swept, self._pending = state["watermark"], state["swept"], list(state["pending"])
        self._keys = {k: [deque(w), list(s)] for k, w, s in state["keys"]}

    # -- copies: key groups move with their windows and waiting tuples -----------------------
    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The keys where ``owns(key)``: their window events, slots and waiting tuples."""
        return {**state, "pending": [p for p in state["pending"] if owns(p[1])],
                "keys": [entry for entry in state["keys"] if owns(entry[0])]}

    def merge_states(self, states: list) -> dict:
        """Every instance's keys (disjoint) at the least advanced watermark."""
        return {**states[0], "watermark": min(s["watermark"] for s in states),
                "swept": min(s["swept"] for s in states),
                "pending": sorted((p for s in states for p in s["pending"]), key=itemgetter(0)),
                "keys": [entry for s in states for entry in s["keys"]]}


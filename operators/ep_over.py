"""Per-event sliding windows of several sizes over one stream, as one operator.

The JEPC aggregation runs Count queries ``COUNT(*) OVER (RANGE w_i
PRECEDING)`` with Count different sizes ``w_i``. As Count ``over_window``
operators, every event is held, sorted and released Count times; here it is
held and released once, then each *lane* (one :class:`OverWindow` per
distinct size, itself shared by every query of that size and key) slides
and folds it. Each lane is the very operator a query would have alone, so
rows are equal to the last bit (same folds, same order); per query, rows
come in the order ``over_window`` gives them.

``ep_over(key=None, lanes={size: {query_id: aggregates}})`` emits
``(query_id, row)`` for a tagged ``ep_output``; queries come and go
(``add_query(query_id, size, aggregates)`` / ``remove_query``). Late events
(``ts <= watermark`` on arrival) go to the ``late`` side output once.
"""

from __future__ import annotations

from collections import deque
from itertools import groupby
from operator import itemgetter
from typing import Any, Callable

from pescheduler.operator import MIN_WATERMARK, Emitter, Operator, OperatorContext, Parallelism
from pescheduler.timeutil import parse_duration

from .over_window import OverWindow


_COUNT = ("count(None)",)      # the plan layout of a lane whose queries only count rows


class OverLanes(Operator):
    """Over-windows of several sizes sharing their input; see the module docstring."""

    name = "ep_over"
    parallelism = Parallelism.KEYED
    outputs = ("late",)

    def __init__(self, key: str | Callable | None = None, lanes: dict | None = None,
                 ts_field: str = "ts") -> None:
        self.key, self.ts_field = key, ts_field
        self.lanes: dict[int, OverWindow] = {}
        self._of: dict[Any, int] = {}             # query id -> its lane's size
        self._pending: list = []
        self._wm = MIN_WATERMARK
        self._context: OperatorContext | None = None
        for size, queries in (lanes or {}).items():
            for query_id, aggregates in queries.items():
                self.add_query(query_id, size, aggregates)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._context = context
        for lane in self.lanes.values():
            lane.open(context)

    @property
    def query_ids(self) -> list:
        return list(self._of)

    def add_query(self, query_id: Any, size: Any, aggregates: dict) -> None:
        size = parse_duration(size)
        lane = self.lanes.get(size)
        if lane is None:
            lane = OverWindow(size, key=self.key, ts_field=self.ts_field, queries={query_id: aggregates})
            lane._wm = lane._swept = self._wm
            if self._context is not None:
                lane.open(self._context)
            self.lanes[size] = lane
        else:
            lane.add_query(query_id, aggregates)
        self._of[query_id] = size

    def remove_query(self, query_id: Any) -> None:
        size = self._of.pop(query_id)
        lane = self.lanes[size]
        lane.remove_query(query_id)
        if not lane.query_ids:
            del self.lanes[size]

    def parameters(self) -> dict:
        return {"key": self.key, "ts_field": self.ts_field,
                "lanes": {size: lane.parameters()["queries"] for size, lane in self.lanes.items()}}

    # -- data ------------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        lanes = list(self.lanes.values())
        if lanes:                                 # the lanes' hold: one key function, one watermark
            lane = lanes[0]
            lane._wm, lane._pending = self._wm, self._pending
            lane._hold(batch, emit)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        self._wm = watermark
        ready = [p for p in self._pending if p[0] <= watermark]
        if ready:
            self._pending = [p for p in self._pending if p[0] > watermark]
            ready.sort(key=itemgetter(0))
        lanes = list(self.lanes.values())
        if ready:
            out = emit.append
            # per lane: COUNT(*) outputs, or the query taggers, made once per release (not per row)
            plans = [(lane, self._counts(lane)) for lane in lanes]
            tags = [None if counts is not None else [(rows, lambda row, q=q: out((q, row))) for q, rows in lane._rows]
                    for lane, counts in plans]
            for ts, step in groupby(ready, itemgetter(0)):
                peers: dict[Any, list] = {}
                for _, k, t in step:
                    peers.setdefault(k, []).append(t)
                for (lane, counts), tagged in zip(plans, tags):
                    if counts is not None:
                        for k, events in peers.items():
                            self._count(lane, counts, k, ts, events, out)
                        continue
                    if lane._subtract is None:          # min/max: the lane refolds (over_window)
                        for k, events in peers.items():
                            lane._step(k, ts, events, emit)
                        continue
                    for k, events in peers.items():
                        self._slide(lane, tagged, k, ts, events, emit)
        for lane in lanes:
            lane._wm = watermark
            if watermark - lane._swept >= lane.size:
                lane._sweep(watermark)

    @staticmethod
    def _counts(lane: OverWindow) -> list | None:
        """``[(query id, output names)]`` when every query of ``lane`` asks ``COUNT(*)`` only
        (the JEPC aggregation), else None."""
        if lane._compiled != _COUNT:
            return None
        if getattr(lane, "_counted", (None,))[0] is not lane._rows:
            names = [(q, tuple(out for out, _ in query.outputs)) for q, (_, query) in lane._queries.items()]
            lane._counted = (lane._rows, names)
        return lane._counted[1]

    @staticmethod
    def _count(lane: OverWindow, counts: list, k: Any, ts: int, events: list, out: Any) -> None:
        """A COUNT(*) lane: the count is the window's length, the rows are written here (the
        same rows as the plan's row writer: key, window_start, window_end, then the outputs)."""
        state = lane._keys.get(k)
        if state is None:
            window = deque()
            state = lane._keys[k] = [window, [0]]
        else:
            window = state[0]
            bound = ts - lane.size
            while window and window[0][0] <= bound:
                window.popleft()
        for t in events:
            window.append((ts, t))
        n = state[1][0] = len(window)
        ws, we, key = ts - lane.size + 1, ts + 1, lane._key_name
        for _ in events:
            for q, names in counts:
                row = {key: k, "window_start": ws, "window_end": we} if key else \
                    {"window_start": ws, "window_end": we}
                for name in names:
                    row[name] = n
                out((q, row))

    @staticmethod
    def _slide(lane: OverWindow, tagged: list, k: Any, ts: int, events: list, emit: Emitter) -> None:
        """``OverWindow._step`` of an invertible lane, inlined: the same folds in the same order
        (so the same rows), without its per-call overheads (the hot path of Count lanes)."""
        state = lane._keys.get(k)
        if state is None:
            window, slots = deque(), None
        else:
            window, slots = state
            bound, subtract = ts - lane.size, lane._subtract
            while window and window[0][0] <= bound:
                subtract(slots, window.popleft()[1])
        fold, taken = lane._fold, 0
        for t in events:
            try:
                slots = fold(slots, t)
            except Exception as exc:            # fold changes nothing when it raises
                emit.dead_letter(t, exc)
                continue
            window.append((ts, t))
            taken += 1
        if not window:
            lane._keys.pop(k, None)
            return
        if state is None:
            lane._keys[k] = [window, slots]
        else:
            state[1] = slots
        group = ((k, slots),)
        ws, we = ts - lane.size + 1, ts + 1
        for _ in range(taken):
            for rows, tag in tagged:
                rows(group, ws, we, tag)

    # -- state ---------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {"watermark": self._wm, "pending": list(self._pending),
                "lanes": {size: lane.snapshot() for size, lane in self.lanes.items()}}

    def restore(self, state: dict) -> None:
        self._wm, self._pending = state["watermark"], list(state["pending"])
        for size, s in state["lanes"].items():
            self.lanes[size].restore(s)

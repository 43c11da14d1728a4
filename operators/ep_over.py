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

from pescheduler.operator import MAX_WATERMARK, MIN_WATERMARK, Emitter, Operator, OperatorContext, Parallelism
from pescheduler.timeutil import parse_duration

from .over_window import OverWindow
from .window import released


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
        self._plan: tuple | None = None          # _compile_lanes(), made again when lanes change
        self._sweep_due = MIN_WATERMARK           # the watermark at which a lane is next swept
        self._context: OperatorContext | None = None
        for size, queries in (lanes or {}).items():
            for query_id, aggregates in queries.items():
                self.add_query(query_id, size, aggregates)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._context = context
        for lane in self.lanes.values():
            lane.open(context)
        self._plan = None                         # the key may be in the generated code

    @property
    def query_ids(self) -> list:
        return list(self._of)

    def add_query(self, query_id: Any, size: Any, aggregates: dict) -> None:
        size = parse_duration(size)
        lane = self.lanes.get(size)
        if lane is None:
            lane = OverWindow.lane(size, key=self.key, ts_field=self.ts_field, queries={query_id: aggregates})
            lane._wm = lane._swept = self._wm
            if self._context is not None:
                lane.open(self._context)
            self.lanes[size] = lane
        else:
            lane.add_query(query_id, aggregates)
        self._of[query_id] = size
        self._plan, self._sweep_due = None, MIN_WATERMARK

    def remove_query(self, query_id: Any) -> None:
        size = self._of.pop(query_id)
        lane = self.lanes[size]
        lane.remove_query(query_id)
        if not lane.query_ids:
            del self.lanes[size]
        self._plan, self._sweep_due = None, MIN_WATERMARK

    def parameters(self) -> dict:
        return {"key": self.key, "ts_field": self.ts_field,
                "lanes": {size: lane.parameters()["queries"] for size, lane in self.lanes.items()}}

    # -- data ------------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        lane = next(iter(self.lanes.values()), None)     # (no list of the lanes per batch)
        if lane is not None:                      # the lanes' hold: one key function, one watermark
            lane._wm, lane._pending = self._wm, self._pending
            lane._hold(batch, emit)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        self._wm = watermark
        ready, self._pending = released(self._pending, watermark)
        if ready:
            if self._plan is None:
                self._plan = self._compile_lanes()
            counting, others = self._plan
            if len(ready) == 1 and counting is not None and not others:    # one event, COUNT(*) lanes only (JEPC)
                ts, k, t = ready[0]
                counting(ts, {k: [t]}, emit)
            else:
                self._release(ready, counting, others, emit)
        if watermark >= self._sweep_due:           # not a loop over the lanes per watermark
            for lane in self.lanes.values():
                if watermark - lane._swept >= lane.size:
                    lane._sweep(watermark)
            self._sweep_due = min((lane._swept + lane.size for lane in self.lanes.values()),
                                  default=MAX_WATERMARK)

    def _release(self, ready: list, counting: Callable | None, others: list, emit: Emitter) -> None:
        """Slide every lane over ``ready`` (``(ts, key, event)`` by ts), a timestamp at a time."""
        out = emit.append
        # the other lanes' query taggers, made once per release (not per row)
        tags = [None if lane._subtract is None else
                [(rows, lambda row, q=q: out((q, row))) for q, rows in lane._rows] for lane in others]
        for ts, step in groupby(ready, itemgetter(0)):
            peers: dict[Any, list] = {}
            for _, k, t in step:
                peers.setdefault(k, []).append(t)
            if counting is not None:
                counting(ts, peers, emit)
            for lane, tagged in zip(others, tags):
                if tagged is None:                  # min/max: the lane refolds (over_window)
                    for k, events in peers.items():
                        lane._step(k, ts, events, emit)
                    continue
                for k, events in peers.items():
                    self._slide(lane, tagged, k, ts, events, emit)

    def _compile_lanes(self) -> tuple[Callable | None, list[OverWindow]]:
        """``(counting, others)``: one generated ``counting(ts, peers, emit)`` for every lane whose
        queries only ask ``COUNT(*)`` (the JEPC aggregation; None when there is none), and the
        other lanes, which fold. Made again when queries come or go, or state is restored."""
        counting = [lane for lane in self.lanes.values() if lane._compiled == _COUNT]
        others = [lane for lane in self.lanes.values() if lane._compiled != _COUNT]
        return (_count_lanes(counting) if counting else None), others

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
                "lanes": {size: {**lane.snapshot(), "watermark": self._wm}      # lanes follow ours
                          for size, lane in self.lanes.items()}}

    def restore(self, state: dict) -> None:
        self._wm, self._pending = state["watermark"], list(state["pending"])
        for size, s in state["lanes"].items():
            self.lanes[size].restore(s)
        self._plan, self._sweep_due = None, MIN_WATERMARK


def _count_lanes(lanes: list[OverWindow]) -> Callable:
    """Generate ``counting(ts, peers, emit)``: every ``COUNT(*)`` lane of ``lanes`` slid to ``ts``,
    ``peers`` ({key: events at ts}) appended, and the rows of each of its queries written
    (``emit.extend``: on Python 3.11 a method call, faster than calling a bound ``extend``).

    A lane's count is its window's length, so it keeps no fold: each key's state is
    ``[deque of (ts, event), [count]]``, the state ``OverWindow`` keeps for that plan (so a
    lane may leave this path when a query asking more joins it, and snapshots are its own).
    Unrolled per lane and query, the rows are dict displays with constant keys (the same
    rows as the plan's row writer: key, window_start, window_end, then the outputs).
    """
    from pescheduler.aggregates import _generate

    namespace: dict[str, Any] = {"deque": deque}

    def literal(value: Any) -> str:
        if type(value) is str:
            return repr(value)
        name = f"_v{len(namespace)}"
        namespace[name] = value
        return name

    lines = ["def counting(ts, peers, emit):", "    we = ts + 1",
             "    for k, events in peers.items():",
             "        items = [(ts, events[0])] if len(events) == 1 else [(ts, t) for t in events]"]
    rows = []
    for i, lane in enumerate(lanes):
        namespace[f"_lane{i}"] = lane
        lines += [f"        keys = _lane{i}._keys",
                  "        state = keys.get(k)",
                  "        if state is None:",
                  "            window = deque(items)",
                  f"            n{i} = len(window)",
                  f"            keys[k] = [window, [n{i}]]",
                  "        else:",
                  "            window = state[0]",
                  f"            bound = ts - {lane.size}",
                  "            while window and window[0][0] <= bound:",
                  "                window.popleft()",
                  "            window.extend(items)",
                  f"            n{i} = state[1][0] = len(window)"]
        head = [] if lane._key_name is None else [f"{lane._key_name!r}: k"]
        head += [f"'window_start': ts - {lane.size - 1}", "'window_end': we"]
        for qid, (_, query) in lane._queries.items():
            row = ", ".join(head + [f"{literal(name)}: n{i}" for name in query.names])
            rows.append(f"({literal(qid)}, {{{row}}})")
    # every query's row in one list display (no call per row); one row per event (peers)
    lines += ["        for _ in events:", "            emit.extend([" + ",\n                  ".join(rows) + "])"]
    return _generate(lines, "counting", namespace, f"ep_over counting {len(lanes)} lanes")

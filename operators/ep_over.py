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

State: each key's windows, ``{size: [deque of (ts, event), slots]}``, live in the deployment's
keyed state backend (``pescheduler.state``: memory or disk, docs/state.md), one store for every
lane; a snapshot holds whole key groups and a rescale moves key groups with their keys' waiting
events. A release reads a key once and writes it back once (a key put since the snapshot is
changed in place: ``writable``).
"""

from __future__ import annotations

from collections import deque
from itertools import groupby
from operator import itemgetter
from typing import Any, Callable

from pescheduler.operator import MAX_WATERMARK, MIN_WATERMARK, Emitter, Operator, OperatorContext, Parallelism
from pescheduler.state import KeyedState, MemoryState, adopt, key_group, pack_group
from pescheduler.state.groups import (add_groups, merge_groups, parted, restore_groups, rewrite, snapshot_groups,
                                      split_groups, take_groups)
from pescheduler.timeutil import parse_duration

from .over_window import OverWindow, fold_in
from .window import AggregatingWindow, released


_COUNT = ("count(None)",)      # the plan layout of a lane whose queries only count rows


class _Lane(OverWindow):
    """One size's over window, whose windows are its :class:`OverLanes`' (``{size: [window, slots]}``
    per key in their keyed state): it holds the plan, the folds and the row writers only."""

    _owner: "OverLanes"                         # set by the owner when it makes the lane

    def open(self, context: OperatorContext) -> None:
        AggregatingWindow.open(self, context)    # no keyed state of its own: its owner's

    def _slot_lists(self):
        return (state[1] for state in self._owner._lane_windows(self.size))

    def add_query(self, query_id: Any, aggregates: dict) -> None:
        """As ``OverWindow.add_query``: aggregates new to the plan are folded from each key's window."""
        AggregatingWindow.add_query(self, query_id, aggregates)
        self._complete(self._owner._lane_windows(self.size))


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
        # key -> {size: [deque of (ts, event), slots]}; in memory until open() moves it to the
        # deployment's backend (restore comes before open)
        self._windows: KeyedState = MemoryState()
        for size, queries in (lanes or {}).items():
            for query_id, aggregates in queries.items():
                self.add_query(query_id, size, aggregates)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._context = context
        self._windows = adopt(context, self._windows)
        for lane in self.lanes.values():
            lane.open(context)
        self._plan = None                         # the key may be in the generated code

    def _lane_windows(self, size: int):
        """Every key's ``[window, slots]`` of lane ``size``, to change in place: each group's keys
        are put back once changed (a disk backend's values are copies; ``get`` copies a memory
        value a checkpoint's view may still be reading)."""
        state = self._windows
        for g in state.groups():
            entries = [(k, state.get(k)) for k, _ in list(state.items(g))]
            yield from (value[size] for _, value in entries if size in value)
            state.write_many(entries)

    @property
    def query_ids(self) -> list:
        return list(self._of)

    def add_query(self, query_id: Any, size: Any, aggregates: dict) -> None:
        size = parse_duration(size)
        lane = self.lanes.get(size)
        if lane is None:
            lane = _Lane(size, key=self.key, ts_field=self.ts_field, queries={query_id: aggregates})
            lane._owner = self
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
            self._rewrite(lambda value: {n: w for n, w in value.items() if n != size} if size in value else value)
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
        """Each key's windows are read from the backend once per release (a key put since the
        snapshot: a dict lookup, changed in place) and written back once, at its end."""
        self._wm = watermark
        ready, self._pending = released(self._pending, watermark)
        if ready:
            if self._plan is None:
                self._plan = self._compile_lanes()
            state = self._windows
            hot = state.writable() or {}            # None on disk (copies): every key is put back
            read: dict = {}                         # key -> its windows read this release
            if len(ready) == 1:                     # one event (pushed one at a time: JEPC)
                ts, k, t = ready[0]
                self._step(ts, {k: [t]}, hot, read, emit)
            else:
                for ts, step in groupby(ready, itemgetter(0)):
                    peers: dict[Any, list] = {}
                    for _, k, t in step:
                        peers.setdefault(k, []).append(t)
                    self._step(ts, peers, hot, read, emit)
            if read:
                state.write_many([(k, v) for k, v in read.items() if v],
                                 [k for k, v in read.items() if v is not None and not v])
        if watermark >= self._sweep_due:           # not a loop over the lanes per watermark
            self._sweep(watermark)

    def _step(self, ts: int, peers: dict, hot: dict, read: dict, emit: Emitter) -> None:
        """Slide every lane of each key of ``peers`` ({key: events at ts}) to ``ts``."""
        counting, others = self._plan
        out = emit.append
        # the other lanes' query taggers (None: a lane that refolds), made once per timestamp, not per row
        tags = [None if lane._subtract is None else
                [(rows, lambda row, q=q: out((q, row))) for q, rows in lane._rows] for lane in others]
        state = self._windows
        for k, events in peers.items():
            value = hot.get(k)
            if value is None:
                value = read.get(k)
                if value is None:
                    value = read[k] = state.get(k) or {}
            if counting is not None:
                counting(ts, k, events, value, emit)
            for lane, tagged in zip(others, tags):
                if tagged is None:                  # min/max: the lane refolds (over_window)
                    self._refold(lane, value, k, ts, events, emit)
                else:
                    self._slide(lane, value, tagged, k, ts, events, emit)

    def _sweep(self, watermark: int) -> None:
        """Forget the windows whose every event is a lane's size behind the watermark (no future
        row sees them); a key left with none is deleted. When one lane is due every lane is swept,
        in one pass over the state (not a pass per lane: sizes differ a little in JEPC's Count lanes)."""
        if any(watermark - lane._swept >= lane.size for lane in self.lanes.values()):
            for lane in self.lanes.values():
                lane._swept = watermark
            smallest = min(self.lanes)
            self._rewrite(lambda value: _quiet(value, watermark, smallest))
        self._sweep_due = min((lane._swept + lane.size for lane in self.lanes.values()), default=MAX_WATERMARK)

    def _rewrite(self, change: Callable[[dict], dict]) -> None:
        rewrite(self._windows, change)

    def _compile_lanes(self) -> tuple[Callable | None, list[OverWindow]]:
        """``(counting, others)``: one generated ``counting(ts, k, events, value, emit)`` for every lane whose
        queries only ask ``COUNT(*)`` (the JEPC aggregation; None when there is none), and the
        other lanes, which fold. Made again when queries come or go, or state is restored."""
        counting = [lane for lane in self.lanes.values() if lane._compiled == _COUNT]
        others = [lane for lane in self.lanes.values() if lane._compiled != _COUNT]
        return (_count_lanes(counting) if counting else None), others

    @staticmethod
    def _slide(lane: OverWindow, value: dict, tagged: list, k: Any, ts: int, events: list, emit: Emitter) -> None:
        """``OverWindow._step`` of an invertible lane, inlined: the same folds in the same order
        (so the same rows), without its per-call overheads (the hot path of Count lanes); the
        key's window is ``value[lane.size]`` (changed in place)."""
        size = lane.size
        state = value.get(size)
        if state is None:
            window, slots = deque(), None
        else:
            window, slots = state
            bound, subtract = ts - size, lane._subtract
            while window and window[0][0] <= bound:
                subtract(slots, window.popleft()[1])
        slots, taken = fold_in(lane._fold, slots, window, ts, events, emit)
        if not window:
            value.pop(size, None)
            return
        if state is None:
            value[size] = [window, slots]
        else:
            state[1] = slots
        group = ((k, slots),)
        ws, we = ts - size + 1, ts + 1
        for _ in range(taken):
            for rows, tag in tagged:
                rows(group, ws, we, tag)

    @staticmethod
    def _refold(lane: OverWindow, value: dict, k: Any, ts: int, events: list, emit: Emitter) -> None:
        """``OverWindow._step`` of a lane that cannot subtract (min, max): evicted events make it
        fold the rest again; the key's window is ``value[lane.size]`` (changed in place)."""
        size = lane.size
        state = value.get(size)
        window, slots = state if state is not None else (deque(), None)
        if lane._evict(window, slots, ts - size):
            slots = None
            for _, old in window:
                slots = lane._fold(slots, old)
        slots, taken = fold_in(lane._fold, slots, window, ts, events, emit)
        if not window:
            value.pop(size, None)
            return
        value[size] = [window, slots]
        out = emit.append
        for _ in range(taken):
            lane._emit([(k, slots)], ts - size + 1, ts + 1, out)

    # -- state: each key's windows, in whole key groups ---------------------------------------
    def snapshot(self) -> dict:
        """Waiting events, the watermark, each lane's plan layout and sweep, and the key groups of
        the keyed state (every key's windows; packed when read: a copy)."""
        return {**self._header(), "pending": list(self._pending), "groups": snapshot_groups(self._windows)}

    def _header(self) -> dict:
        return {"watermark": self._wm,
                "lanes": {size: {"layout": lane.plan.layout, "swept": lane._swept} for size, lane in self.lanes.items()}}

    def restore(self, state: dict) -> None:
        self._check(state)
        self._wm, self._pending = state["watermark"], list(state["pending"])
        for size, saved in state["lanes"].items():
            self.lanes[size]._wm, self.lanes[size]._swept = self._wm, saved["swept"]
        restore_groups(self._windows, _groups(state))
        self._plan, self._sweep_due = None, MIN_WATERMARK

    def _check(self, state: dict) -> None:
        """Refuse state of other lanes or plan layouts."""
        mine = {size: lane.plan.layout for size, lane in self.lanes.items()}
        theirs = {size: saved["layout"] for size, saved in state["lanes"].items()}
        if theirs != mine:
            raise ValueError(f"ep_over state of lanes {theirs} cannot be restored into {mine}")

    # -- copies: key groups move with their windows and waiting events ---------------------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their keys'
        windows and waiting events in :meth:`snapshot`'s form (a new instance is restored from
        it), removed here; the moving groups are packed only when the part is pickled."""
        leaving, self._pending = parted(self._pending, map(itemgetter(1), self._pending), groups)
        return {**self._header(), "pending": leaving, "groups": take_groups(self._windows, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported join this running one; its own watermark stays
        (the events handed over wait for the next one)."""
        self._check(state)
        add_groups(self._windows, state["groups"])
        self._pending = sorted(self._pending + list(state["pending"]), key=itemgetter(0))

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(key)`` and their keys' waiting events."""
        return {**state, "lanes": _lanes(state), "pending": [p for p in state["pending"] if owns(p[1])],
                "groups": split_groups(_groups(state), owns)}

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups and waiting events (disjoint keys), at the least advanced
        watermark and sweep."""
        lanes = {size: {"layout": saved["layout"], "swept": min(_lanes(st)[size]["swept"] for st in states)}
                 for size, saved in _lanes(states[0]).items()}
        return {"watermark": min(st["watermark"] for st in states), "lanes": lanes,
                "pending": sorted((p for st in states for p in st["pending"]), key=itemgetter(0)),
                "groups": merge_groups([_groups(st) for st in states])}


def _lanes(state: dict) -> dict:
    """``{size: {"layout", "swept"}}`` of a snapshot (of either form)."""
    return {size: {"layout": saved["layout"], "swept": saved["swept"]} for size, saved in state["lanes"].items()}


def _groups(state: dict) -> dict:
    """A snapshot's key groups; one a checkpoint took while each lane held its windows in a dict
    of its own (``lanes``: ``{size: {..., "keys": [(key, events, slots)]}}``) is grouped here, so
    it still restores."""
    if "groups" in state:
        return state["groups"]
    values: dict = {}
    for size, saved in state["lanes"].items():
        for k, w, slots in saved["keys"]:
            values.setdefault(k, {})[size] = [deque(w), list(slots)]
    by_group: dict[int, list] = {}
    for k, value in values.items():
        by_group.setdefault(key_group(k), []).append((k, value))
    return {g: (items[0][0], pack_group(items)) for g, items in by_group.items()}


def _quiet(value: dict, watermark: int, smallest: int) -> dict:
    """``value`` (a key's windows by size) without the windows whose every event is their lane's
    size behind ``watermark`` (``value`` itself when none is). Every lane took the key's events,
    so one window's newest says how long the key was quiet: the usual case is that one look (a
    window a failed fold left older stays until the key's next sweep or step: memory only)."""
    for state in value.values():
        if watermark - state[0][-1][0] < smallest:
            return value
        break
    return {size: state for size, state in value.items() if state[0][-1][0] > watermark - size}


def _count_lanes(lanes: list[OverWindow]) -> Callable:
    """Generate ``counting(ts, k, events, value, emit)``: every ``COUNT(*)`` lane of ``lanes`` slid
    to ``ts`` for key ``k`` (its windows ``value``, changed in place), ``events`` appended, and the
    rows of each of its queries written (``emit.extend``: on Python 3.11 a method call, faster
    than calling a bound ``extend``).

    A lane's count is its window's length, so it keeps no fold: each key's window is
    ``[deque of (ts, event), [count]]``, the state ``OverWindow`` keeps for that plan (so a
    lane may leave this path when a query asking more joins it).
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

    lines = ["def counting(ts, k, events, value, emit):", "    we = ts + 1",
             "    items = [(ts, events[0])] if len(events) == 1 else [(ts, t) for t in events]"]
    rows = []
    for i, lane in enumerate(lanes):
        lines += [f"    state = value.get({lane.size})",
                  "    if state is None:",
                  "        window = deque(items)",
                  f"        n{i} = len(window)",
                  f"        value[{lane.size}] = [window, [n{i}]]",
                  "    else:",
                  "        window = state[0]",
                  f"        bound = ts - {lane.size}",
                  "        while window and window[0][0] <= bound:",
                  "            window.popleft()",
                  "        window.extend(items)",
                  f"        n{i} = state[1][0] = len(window)"]
        head = [] if lane._key_name is None else [f"{lane._key_name!r}: k"]
        head += [f"'window_start': ts - {lane.size - 1}", "'window_end': we"]
        for qid, (_, query) in lane._queries.items():
            row = ", ".join(head + [f"{literal(name)}: n{i}" for name in query.names])
            rows.append(f"({literal(qid)}, {{{row}}})")
    # every query's row in one list display (no call per row); one row per event (peers)
    lines += ["    for _ in events:", "        emit.extend([" + ",\n              ".join(rows) + "])"]
    return _generate(lines, "counting", namespace, f"ep_over counting {len(lanes)} lanes")

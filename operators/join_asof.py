"""As-of join: each left event with the right event of its key nearest before (or after) its time.

``join_asof(by, on="ts", tolerance=None, direction="backward")``
(``left.join_asof(right, by="symbol", tolerance="5s")``) emits, for every left
event ``l``, exactly one result ``{"left": l, "right": r, "ts": l[on]}`` where
``r`` is, among the right events of the same ``by`` key (pandas ``merge_asof``
semantics):

* ``"backward"``: the latest with ``r[on] <= l[on]`` (equal times match; of
  several right events at that time, the last to arrive),
* ``"forward"``: the earliest with ``r[on] >= l[on]`` (of several at that
  time, the first to arrive),
* ``"nearest"``: the closer of those two (a tie goes to the backward one),

and within ``tolerance`` of ``l[on]`` (inclusive); ``r`` is ``None`` when no
right event qualifies (a left join: no left event is lost).

Exact under out-of-order input: events wait until the watermark passes them
and are then taken in time order, so the result does not depend on how either
input was shuffled within ``max_delay``. A backward result is emitted when the
watermark reaches ``l[on]`` (every right event at or before it has come); a
forward or nearest one when the first right event after ``l[on]`` is taken, or
when the watermark shows none can come that would be chosen (``l[on] +
tolerance``, or the backward match's distance past ``l[on]``); with no
tolerance and no right event after it, at the end of the stream. A result's ``ts``
is its left event's: a forward or nearest result may come after the watermark
passed it, so the join's output watermark is held back to just before the oldest
left event still waiting (:meth:`AsofJoin.held_watermark`): an event-time
operator after the join (a window) counts every result on time. A wait with
no tolerance can hold event time downstream until the key's next right event
(or the end of the stream): give a ``tolerance`` to bound it. An event with
``on <= watermark`` on arrival is late and goes to the ``late`` side output
(the window's lateness rule); one without a time or key is dead-lettered.

State: each key's last right event and its left events waiting for a forward
match live in the deployment's keyed state backend (``pescheduler.state``), so
checkpoints hold whole key groups and copies move them (KEYED): a rescale takes the
moving groups out of the backend (``export_groups``) and adds them to the gaining instance
(``import_groups``) with their held events and waiting lefts, at the cost of the moving
groups. The last right event of a key is kept as long as the key is (one event per key).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable

from pescheduler.operator import MAX_WATERMARK, MIN_WATERMARK, Emitter, Operator, OperatorContext, Parallelism
from pescheduler.state import MemoryState, adopt, key_group
from pescheduler.state.groups import (add_groups, merge_groups, restore_groups, snapshot_groups, split_groups,
                                      take_groups, write_batch)
from pescheduler.timeutil import parse_duration

from .window import hold, key_getter, released

DIRECTIONS = ("backward", "forward", "nearest")
LEFT, RIGHT = 0, 1
_NOTHING = (None, ())                   # a key's value: (last right (ts, event) | None, waiting lefts); this one: none


class AsofJoin(Operator):
    """As-of join of a left and a right stream by key; see the module docstring.

    ``by``: the key field (or callable) of both sides; by default the preceding ``key_by``'s.
    ``on``: the time field of both sides. ``tolerance``: how far (a duration, inclusive) the
    right event may be from the left one; ``None``: any distance. ``direction``: ``"backward"``
    (the latest right event at or before the left one), ``"forward"`` (the earliest at or after)
    or ``"nearest"`` (the closer of the two).
    """

    name = "join_asof"
    parallelism = Parallelism.KEYED
    outputs = ("late",)

    def __init__(self, by: str | Callable | None = None, on: str = "ts", tolerance: Any = None,
                 direction: str = "backward") -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"join_asof: direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
        if not isinstance(on, str):
            raise TypeError(f"join_asof: on= names the time field of both sides, got {on!r}")
        self.by, self.on, self.direction = by, on, direction
        self.tolerance = None if tolerance is None else parse_duration(tolerance)
        # at equal times, backward and nearest take the right event first (an exact match wins),
        # forward the left one (it waits for the right events of its own time)
        self._rank = (1, 0) if direction == "backward" or direction == "nearest" else (0, 1)
        self._key_of = key_getter(by)
        self._wm = MIN_WATERMARK
        self._pending: list[list] = [[], []]     # per side: (ts, key, event) not yet passed
        self._keys = MemoryState()                      # moved to the deployment's backend at open
        self._waiting: set = set()                      # keys with left events waiting (forward, nearest)
        self._oldest: int | None = None                 # the time of the oldest of those lefts

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self.by is None:
            if context.key_field is None:
                raise ValueError("join_asof needs a key: by= or a key_by before it")
            self._key_of = key_getter(context.key_field)
        self._keys = adopt(context, self._keys)

    # -- data -------------------------------------------------------------------------
    def process_input(self, input_index: int, batch: list, emit: Emitter) -> None:
        """A batch from input ``input_index`` (0 left, 1 right; the order of ``extra["inputs"]``)."""
        if input_index not in (LEFT, RIGHT):
            raise ValueError(f"join_asof has two inputs (0 left, 1 right), got input {input_index!r}")
        hold(batch, emit, self.on, self._wm, self._pending[input_index], self._key_of)

    def process(self, batch: list, emit: Emitter) -> None:
        raise TypeError("join_asof needs to know which input a batch is from: the runtime must call "
                        "process_input(input_index, batch, emit)")

    def on_left(self, batch: list, emit: Emitter) -> None:
        self.process_input(LEFT, batch, emit)

    def on_right(self, batch: list, emit: Emitter) -> None:
        self.process_input(RIGHT, batch, emit)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        """Events both sides have up to ``watermark``, in time order; then waits that ended."""
        self._wm = watermark
        ready = self._released(watermark)
        # The keys' values this pass leaves are gathered in ``now`` (key -> (last, waiting),
        # _NOTHING once gone) and written once, at the end: a dict store per event instead of a
        # backend call (write_batch); a key read is looked for there first.
        now: dict = {}
        try:
            for _ts, _rank, k, side, t in ready:
                if side == RIGHT:
                    self._take_right(k, t, emit, now)
                else:
                    self._take_left(k, t, emit, now)
            self._expire(watermark, emit, now)
        finally:
            write_batch(self._keys, now, _NOTHING)

    def held_watermark(self) -> int | None:
        """Just before the oldest left event still waiting (its result is still to come), if any."""
        return None if self._oldest is None else self._oldest - 1

    def _released(self, watermark: int) -> list:
        """``(ts, rank, key, side, event)`` of both sides up to ``watermark``, in the order taken."""
        out = []
        for side in (LEFT, RIGHT):
            ready, rest = released(self._pending[side], watermark)
            self._pending[side] = rest
            rank = self._rank[side]
            out.extend((ts, rank, k, side, t) for ts, k, t in ready)
        out.sort(key=itemgetter(0, 1))      # stable: arrival order within a time and side
        return out

    def _take_right(self, k: Any, r: Any, emit: Emitter, now: dict) -> None:
        """A right event resolves the key's waiting lefts (it is the first after them) and becomes
        the key's last right event."""
        _last, waiting = now.get(k) or self._keys.get(k, _NOTHING)
        r_ts = r[self.on]
        for t, l, back in waiting:
            forward = r if self._within(r_ts - t) else None
            emit(self._result(l, t, self._closer(t, back, forward)))
        self._settle(k, (r_ts, r) if self.direction != "forward" else None, (), now)

    def _take_left(self, k: Any, l: Any, emit: Emitter, now: dict) -> None:
        last, waiting = now.get(k) or self._keys.get(k, _NOTHING)
        t = l[self.on]
        back = last[1] if last is not None and self._within(t - last[0]) else None
        if self.direction == "backward" or (back is not None and last[0] == t):
            emit(self._result(l, t, back))
            return
        now[k] = (last, (*waiting, (t, l, back)))
        self._waiting.add(k)

    def _within(self, distance: int) -> bool:
        return self.tolerance is None or distance <= self.tolerance

    def _closer(self, t: int, back: Any, forward: Any) -> Any:
        """Nearest's choice (forward only if strictly closer); forward's is ``forward``."""
        if back is None or forward is None:
            return forward if back is None else back
        return forward if forward[self.on] - t < t - back[self.on] else back

    def _result(self, l: Any, t: int, r: Any) -> dict:
        return {"left": l, "right": r, "ts": t}

    def _deadline(self, t: int, back: Any) -> float:
        """The watermark past which no right event that would be chosen over ``back`` can come."""
        limit = MAX_WATERMARK if self.tolerance is None else t + self.tolerance
        return limit if back is None else min(limit, t + (t - back[self.on]))

    def _expire(self, watermark: int, emit: Emitter, now: dict) -> None:
        """Emit the waiting lefts whose deadline ``watermark`` has reached (a scan of the keys with
        waiting lefts; only forward and nearest have any), and note the oldest left still waiting."""
        oldest = None
        for k in list(self._waiting):
            last, waiting = now.get(k) or self._keys.get(k)
            due = [self._deadline(t, back) <= watermark for t, _l, back in waiting]
            if any(due):
                for (t, l, back), done in zip(waiting, due):
                    if done:
                        emit(self._result(l, t, back))
                waiting = tuple(w for w, done in zip(waiting, due) if not done)
                self._settle(k, last, waiting, now)
            for t, _l, _back in waiting:
                oldest = t if oldest is None or t < oldest else oldest
        self._oldest = oldest

    def _settle(self, k: Any, last: Any, waiting: tuple, now: dict) -> None:
        now[k] = (last, waiting) if waiting or last is not None else _NOTHING
        if not waiting:
            self._waiting.discard(k)

    # -- state --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Waiting events of both sides, the key groups of the keyed state (a copy), the watermark."""
        return {"direction": self.direction, "tolerance": self.tolerance, "watermark": self._wm,
                "pending": [list(self._pending[LEFT]), list(self._pending[RIGHT])],
                "groups": snapshot_groups(self._keys)}

    def restore(self, state: dict) -> None:
        self._check_shape(state)
        self._wm = state["watermark"]
        self._pending = [list(state["pending"][LEFT]), list(state["pending"][RIGHT])]
        restore_groups(self._keys, state["groups"])
        waiting = [(k, w) for k, (_, w) in self._keys.entries() if w]
        self._waiting = {k for k, _w in waiting}
        self._oldest = min((t for _k, w in waiting for t, _l, _b in w), default=None)

    def _check_shape(self, state: dict) -> None:
        for what in ("direction", "tolerance"):
            if state[what] != getattr(self, what):
                raise ValueError(f"join_asof state of {what}={state[what]!r} cannot be restored into "
                                 f"{what}={getattr(self, what)!r}")

    # -- copies: key groups move with their keys' events ------------------------------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their keys'
        last right events and waiting lefts, taken out of the backend (packed only when the part
        is pickled), and their events held for the watermark, in :meth:`snapshot`'s form. The
        groups that stay are not read: the held events and the keys with waiting lefts are
        (each bounded by what waits for the watermark, not by the keys)."""
        stays = lambda k: key_group(k) not in groups        # noqa: E731
        leaving = [[p for p in side if not stays(p[1])] for side in self._pending]
        self._pending = [[p for p in side if stays(p[1])] for side in self._pending]
        self._waiting = {k for k in self._waiting if stays(k)}
        # self._oldest stays as it is until the next watermark recomputes it: a bound held too
        # low holds the output watermark back a little longer, never too little
        return {"direction": self.direction, "tolerance": self.tolerance, "watermark": self._wm,
                "pending": leaving, "groups": take_groups(self._keys, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported (:meth:`export_groups`) join this running one with
        their held events (their keys are not this instance's: their order within a key is kept)
        and their waiting lefts; its own watermark stays."""
        self._check_shape(state)
        add_groups(self._keys, state["groups"])
        for side in (LEFT, RIGHT):
            self._pending[side] = self._pending[side] + list(state["pending"][side])
        for g in state["groups"]:
            for k, (_last, waiting) in self._keys.items(g):
                if waiting:
                    self._waiting.add(k)
                    oldest = min(t for t, _l, _b in waiting)
                    self._oldest = oldest if self._oldest is None else min(self._oldest, oldest)

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(key)`` and their keys' waiting events."""
        return {**state, "pending": [[p for p in side if owns(p[1])] for side in state["pending"]],
                "groups": split_groups(state["groups"], owns)}

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups (disjoint) at the least advanced watermark."""
        return {**states[0], "watermark": min(s["watermark"] for s in states),
                "pending": [sorted((p for s in states for p in s["pending"][side]), key=itemgetter(0))
                            for side in (LEFT, RIGHT)],
                "groups": merge_groups([s["groups"] for s in states])}

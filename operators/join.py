"""Event-time interval join of two streams on a key, with an optional predicate.

``join(within, on=None, left_key=None, right_key=None, predicate=None)``, or
``join_interval(lower, upper, ...)`` instead of ``within`` (Flink's interval
join; ``within=w`` is its symmetric case ``lower=-w, upper=w``: one operator),
pairs a left event ``l`` and a right event ``r`` when

* their keys are equal (``on`` names one field for both sides; ``left_key`` /
  ``right_key`` a field name or a callable per side; with neither, the key of
  the preceding ``key_by``; with no key at all, every pair is a candidate),
* ``l[ts] + lower <= r[ts] <= l[ts] + upper`` (durations or milliseconds,
  *both bounds inclusive*; with ``within``: ``|l[ts] - r[ts]| <= within``, so
  equal timestamps always qualify, and so does a distance of exactly ``within``),
* ``predicate(l, r)`` is true (when given).

Each result is emitted exactly once, when the second of the two events
arrives (a symmetric hash join: an arriving event probes the other side's
buffer, then joins its own). A result is a new dict
``{"left": l, "right": r, "ts": max(l_ts, r_ts)}``: both events unchanged
(no field-name clashes to resolve), and an event time for what follows.

Watermarks: an event with ``ts <= watermark`` on arrival is late and goes to
the ``late`` side output, unjoined (it could only meet events already
purged). A buffered left event with ``ts <= watermark - upper``, or right
event with ``ts <= watermark + lower``, can meet no future event (they all have
``ts > watermark``) and is forgotten (in bulk, once the oldest is half a
window past that bound).

Two inputs: ``process`` does not say where a batch came from, so the runtime
calls ``process_input(input_index, batch, emit)`` instead, ``input_index``
being the batch's position in ``context.extra["inputs"]``
(``[left_op_id, right_op_id]``). The core logic is ``on_left`` /
``on_right`` / ``on_watermark``, which tests call directly.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import MAX_WATERMARK, Emitter, Operator, OperatorContext, Parallelism
from pescheduler.timeutil import parse_duration, parse_offset


def _key_fn(key: str | Callable | None) -> Callable | None:
    if key is None or callable(key):
        return key
    if isinstance(key, str):
        return itemgetter(key)
    raise TypeError(f"join: a key is a field name or a callable, got {key!r}")


class Join(Operator):
    """Interval join of a left and a right stream; see the module docstring.

    ``within``: the symmetric window, ``|l.ts - r.ts| <= within``. ``lower`` and ``upper``
    instead: the bounds of ``r.ts - l.ts`` (durations, ``"-5s"`` before the left event).

    >>> from pescheduler.operator import Emitter
    >>> j, out = Join(within="5s", on="car"), Emitter()
    >>> j.on_left([{"car": 1, "ts": 1_000, "speed": 9}], out)
    >>> j.on_right([{"car": 1, "ts": 4_000, "fuel": 3}], out)
    >>> out[0]["ts"], out[0]["left"]["speed"], out[0]["right"]["fuel"]
    (4000, 9, 3)
    """

    name = "join"
    parallelism = Parallelism.KEYED
    outputs = ("late",)

    def __init__(self, within: Any = None, on: str | Callable | None = None,
                 left_key: str | Callable | None = None, right_key: str | Callable | None = None,
                 predicate: Callable[[Any, Any], bool] | None = None, ts_field: str = "ts",
                 lower: Any = None, upper: Any = None) -> None:
        self._set_bounds(within, lower, upper)
        if on is not None and (left_key is not None or right_key is not None):
            raise ValueError("join: give either on= (both sides) or left_key=/right_key=, not both")
        if (left_key is None) != (right_key is None):
            raise ValueError("join: left_key and right_key go together (or use on= for both)")
        if predicate is not None and not callable(predicate):
            raise TypeError(f"join: predicate must be callable(left, right), got {predicate!r}")
        self.predicate = predicate
        self.ts_field = ts_field
        self._set_keys(on if on is not None else left_key, on if on is not None else right_key)
        self._inputs: list[str] = []
        # key -> buffered events, in arrival order (one dict per side)
        self._left: dict[Any, list] = {}
        self._right: dict[Any, list] = {}
        self._wm = MIN_WATERMARK
        self._oldest = MAX_WATERMARK       # smallest buffered ts: purge only when it can go

    def _set_bounds(self, within: Any, lower: Any, upper: Any) -> None:
        """``lower``/``upper`` (ms) of ``r[ts] - l[ts]``, from ``within`` or given; ``within``: the
        distance past a watermark an event stays buffered (the larger of the two reaches)."""
        if (within is None) == (lower is None and upper is None) or (lower is None) != (upper is None):
            raise ValueError("join: give within= (a symmetric window) or both lower= and upper=, "
                             f"got within={within!r}, lower={lower!r}, upper={upper!r}")
        if within is not None:
            width = parse_duration(within)
            self.lower, self.upper = -width, width
        else:
            self.lower, self.upper = parse_offset(lower), parse_offset(upper)
        if self.lower > self.upper:
            raise ValueError(f"join: lower ({lower!r}) is after upper ({upper!r}): no pair could qualify")
        self.within = max(self.upper, -self.lower)

    def _set_keys(self, left: str | Callable | None, right: str | Callable | None) -> None:
        self._key_specs = (left, right)
        self._lkey, self._rkey = _key_fn(left), _key_fn(right)
        self._keyed = self._lkey is not None

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._inputs = list(context.extra.get("inputs", ()))
        if not self._keyed and context.key_field is not None:
            self._set_keys(context.key_field, context.key_field)

    def input_keys(self) -> tuple:
        """``(left_key, right_key)`` as given (field names or callables; ``None``: unkeyed).

        What a KEYED router in front of copies hashes, per input: equal key
        values of the two sides must land in the same key group.
        """
        return self._key_specs

    # -- data -------------------------------------------------------------------------
    def process_input(self, input_index: int, batch: list, emit: Emitter) -> None:
        """A batch from input ``input_index`` (0 left, 1 right; order of ``extra["inputs"]``)."""
        if input_index == 0:
            self.on_left(batch, emit)
        elif input_index == 1:
            self.on_right(batch, emit)
        else:
            raise ValueError(f"join has two inputs (0 left, 1 right), got input {input_index!r}")

    def process(self, batch: list, emit: Emitter) -> None:
        raise TypeError("join needs to know which input a batch is from: the runtime must call "
                        "process_input(input_index, batch, emit) (see operators.join)")

    def on_left(self, batch: list, emit: Emitter) -> None:
        self._probe(batch, emit, self._lkey, self._left, self._right, True, (-self.upper, -self.lower))

    def on_right(self, batch: list, emit: Emitter) -> None:
        self._probe(batch, emit, self._rkey, self._right, self._left, False, (self.lower, self.upper))

    def _probe(self, batch: list, emit: Emitter, key: Callable | None, own: dict, other: dict,
               left: bool, reach: tuple) -> None:
        # Hot loop: one probe of the other side's buffer per arriving event; ``reach``: the
        # bounds of ts - o_ts (the arriving event's time less the buffered one's).
        ts_f, (lo, hi), wm, pred = self.ts_field, reach, self._wm, self.predicate
        oldest = self._oldest
        for e in batch:
            ts = e[ts_f]
            if ts <= wm:
                emit.to("late", e)
                continue
            k = key(e) if key is not None else None
            for o in other.get(k, ()):
                o_ts = o[ts_f]
                if lo <= ts - o_ts <= hi:
                    l, r = (e, o) if left else (o, e)
                    if pred is None or pred(l, r):
                        emit({"left": l, "right": r, "ts": ts if ts > o_ts else o_ts})
            bucket = own.get(k)
            if bucket is None:
                own[k] = [e]
            else:
                bucket.append(e)
            if ts < oldest:
                oldest = ts
        self._oldest = oldest

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        self._wm = watermark
        # A purge scans both buffers, so it waits until the oldest event is half a window past
        # the bound (the probe's distance test ignores those meanwhile): amortised O(1) per event.
        if self._oldest <= watermark - self.within - self.within // 2:
            self._purge_both()

    def _purge_both(self) -> None:
        """Forget what can meet nothing that is not late (a left ``ts <= watermark - upper``, a
        right ``ts <= watermark + lower``)."""
        self._oldest = min(self._purge(self._left, self._wm - self.upper),
                           self._purge(self._right, self._wm + self.lower))

    def _purge(self, side: dict, bound: int) -> int:
        """Drop events with ``ts <= bound``; return the oldest ts left (MAX_WATERMARK if none)."""
        ts_f, oldest = self.ts_field, MAX_WATERMARK
        for k in list(side):
            kept = [e for e in side[k] if e[ts_f] > bound]
            if kept:
                side[k] = kept
                oldest = min(oldest, min(e[ts_f] for e in kept))
            else:
                del side[k]
        return oldest

    # -- state --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Both buffers (lists copied; the events themselves are read-only) and the watermark."""
        if self._oldest <= self._wm - self.within:     # what a lazy purge has left over goes first
            self._purge_both()
        return {"within": (self.lower, self.upper), "watermark": self._wm,
                "left": {k: list(v) for k, v in self._left.items()},
                "right": {k: list(v) for k, v in self._right.items()}}

    def split_state(self, state: dict, owns) -> dict:
        """Both buffers restricted to the keys where ``owns(key)``."""
        return {**state, "left": {k: v for k, v in state["left"].items() if owns(k)},
                "right": {k: v for k, v in state["right"].items() if owns(k)}}

    def merge_states(self, states: list) -> dict:
        """Every instance's buffers (disjoint keys) at the least advanced watermark."""
        return {**states[0], "watermark": min(s["watermark"] for s in states),
                "left": {k: v for s in states for k, v in s["left"].items()},
                "right": {k: v for s in states for k, v in s["right"].items()}}

    def restore(self, state: dict) -> None:
        bounds = state["within"]            # (lower, upper); a number in snapshots of a symmetric join
        bounds = (-bounds, bounds) if isinstance(bounds, int) else tuple(bounds)
        if bounds != (self.lower, self.upper):
            raise ValueError(f"join state of bounds {bounds} ms cannot be restored into "
                             f"bounds {(self.lower, self.upper)} ms (within=, or lower= and upper=)")
        self._wm = state["watermark"]
        self._left = {k: list(v) for k, v in state["left"].items()}
        self._right = {k: list(v) for k, v in state["right"].items()}
        ts_f = self.ts_field
        self._oldest = min((e[ts_f] for side in (self._left, self._right)
                            for v in side.values() for e in v), default=MAX_WATERMARK)

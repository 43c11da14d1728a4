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

State: each key's buffered events (``[lefts, rights]``) live in the deployment's keyed
state backend (``pescheduler.state``: memory or disk, docs/state.md), so a checkpoint holds
whole key groups and a rescale moves key groups (``export_groups``/``import_groups``). A
batch reads a key once and writes it once; on ``memory`` a key put since the last snapshot
is appended to in place (``writable()``).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import MAX_WATERMARK, Emitter, Operator, OperatorContext, Parallelism
from pescheduler.state import MemoryState, adopt
from pescheduler.state.groups import add_groups, merge_groups, restore_groups, snapshot_groups, split_groups, take_groups
from pescheduler.timeutil import parse_duration, parse_offset


LEFT, RIGHT = 0, 1


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
        # key -> [left events, right events] buffered, in arrival order; in memory until open()
        # moves it to the deployment's backend (restore comes before open)
        self._keys = MemoryState()
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
        self._keys = adopt(context, self._keys)
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
        self._probe(batch, emit, self._lkey, LEFT, (-self.upper, -self.lower))

    def on_right(self, batch: list, emit: Emitter) -> None:
        self._probe(batch, emit, self._rkey, RIGHT, (self.lower, self.upper))

    def _probe(self, batch: list, emit: Emitter, key: Callable | None, side: int, reach: tuple) -> None:
        # Hot loop: one probe of the other side's buffer per arriving event; ``reach``: the
        # bounds of ts - o_ts (the arriving event's time less the buffered one's). A key put
        # since the snapshot (``writable``) is appended to in place; any other is read once
        # and written back once, at the end of the batch.
        ts_f, (lo, hi), wm, pred = self.ts_field, reach, self._wm, self.predicate
        oldest, keys, left, other = self._oldest, self._keys, side == LEFT, 1 - side
        written = keys.writable()
        hot = {} if written is None else written
        read: dict = {}
        for e in batch:
            ts = e[ts_f]
            if ts <= wm:
                emit.to("late", e)
                continue
            k = key(e) if key is not None else None
            held = hot.get(k)
            if held is None:
                held = read.get(k)
                if held is None:
                    held = read[k] = keys.get(k) or [[], []]
            for o in held[other]:
                o_ts = o[ts_f]
                if lo <= ts - o_ts <= hi:
                    l, r = (e, o) if left else (o, e)
                    if pred is None or pred(l, r):
                        emit({"left": l, "right": r, "ts": ts if ts > o_ts else o_ts})
            held[side].append(e)
            if ts < oldest:
                oldest = ts
        self._oldest = oldest
        if read:
            keys.write_many(read.items())

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        self._wm = watermark
        # A purge scans both buffers, so it waits until the oldest event is half a window past
        # the bound (the probe's distance test ignores those meanwhile): amortised O(1) per event.
        if self._oldest <= watermark - self.within - self.within // 2:
            self._purge_both()

    def _purge_both(self) -> None:
        """Forget what can meet nothing that is not late (a left ``ts <= watermark - upper``, a
        right ``ts <= watermark + lower``): one pass over the keys, the changed ones written back."""
        bounds, ts_f, keys = (self._wm - self.upper, self._wm + self.lower), self.ts_field, self._keys
        oldest, puts, gone = MAX_WATERMARK, [], []
        for k, held in keys.entries():      # one pass, no key groups: on memory the flat index, no fold
            kept = [[e for e in events if e[ts_f] > bound] for events, bound in zip(held, bounds)]
            if not (kept[LEFT] or kept[RIGHT]):
                gone.append(k)
                continue
            if len(kept[LEFT]) != len(held[LEFT]) or len(kept[RIGHT]) != len(held[RIGHT]):
                puts.append((k, kept))
            oldest = min(oldest, *(e[ts_f] for events in kept for e in events))
        keys.write_many(puts, gone)
        self._oldest = oldest

    def _purge_left_over(self) -> None:
        """Purge now what a lazy purge has left over (before a snapshot or an inspection)."""
        if self._oldest <= self._wm - self.within:
            self._purge_both()

    def _oldest_in(self, groups) -> int:
        """The smallest buffered ts of key groups ``groups`` (MAX_WATERMARK if none)."""
        ts_f, keys = self.ts_field, self._keys
        return min((e[ts_f] for g in groups for _k, held in keys.items(g) for events in held for e in events),
                   default=MAX_WATERMARK)

    def buffered(self) -> dict:
        """``{"left": {key: events}, "right": {key: events}}`` of the keys holding some (a copy:
        for tests and inspection, not the hot path), what a lazy purge left over gone first."""
        self._purge_left_over()
        out: dict = {"left": {}, "right": {}}
        for k, held in self._keys.entries():
            for name, events in zip(("left", "right"), held):
                if events:
                    out[name][k] = list(events)
        return out

    # -- state: both buffers by key, in whole key groups -----------------------------------
    def snapshot(self) -> dict:
        """The key groups of the keyed state (packed when read: a copy) and the watermark."""
        self._purge_left_over()
        return {"within": (self.lower, self.upper), "watermark": self._wm, "groups": snapshot_groups(self._keys)}

    def split_state(self, state: dict, owns) -> dict:
        """The key groups where ``owns(key)`` (a checkpoint of the old per-key form: its keys)."""
        if "groups" not in state:
            return {**state, "left": {k: v for k, v in state["left"].items() if owns(k)},
                    "right": {k: v for k, v in state["right"].items() if owns(k)}}
        return {**state, "groups": split_groups(state["groups"], owns)}

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups (disjoint) at the least advanced watermark."""
        merged = {**states[0], "watermark": min(s["watermark"] for s in states)}
        if any("groups" not in s for s in states):
            for s in states:
                if "groups" in s:
                    raise ValueError("join: cannot merge a per-key checkpoint with a key-group one")
            merged["left"] = {k: v for s in states for k, v in s["left"].items()}
            merged["right"] = {k: v for s in states for k, v in s["right"].items()}
            return merged
        merged["groups"] = merge_groups([s["groups"] for s in states])
        return merged

    def restore(self, state: dict) -> None:
        self._check_bounds(state)
        self._wm = state["watermark"]
        if "groups" in state:
            restore_groups(self._keys, state["groups"])
        else:                                   # a checkpoint from before the keyed state backend
            self._keys.drop_groups(self._keys.groups())
            left, right = state["left"], state["right"]
            self._keys.write_many(((k, [list(left.get(k, ())), list(right.get(k, ()))])
                                   for k in {**left, **right}))
        self._oldest = self._oldest_in(self._keys.groups())

    def _check_bounds(self, state: dict) -> None:
        bounds = state["within"]            # (lower, upper); a number in snapshots of a symmetric join
        bounds = (-bounds, bounds) if isinstance(bounds, int) else tuple(bounds)
        if bounds != (self.lower, self.upper):
            raise ValueError(f"join state of bounds {bounds} ms cannot be restored into "
                             f"bounds {(self.lower, self.upper)} ms (within=, or lower= and upper=)")

    # -- copies: key groups move with their buffers ------------------------------------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their
        buffers, removed here, packed only when the part is pickled."""
        return {"within": (self.lower, self.upper), "watermark": self._wm,
                "groups": take_groups(self._keys, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported join this running one (its own watermark stays:
        the imported events' purge bound is the same rule, applied at the next purge)."""
        self._check_bounds(state)
        add_groups(self._keys, state["groups"])
        self._oldest = min(self._oldest, self._oldest_in(sorted(state["groups"])))

"""Keyed process functions with timers: ``stream.key_by(k).process(MyFn, **params)``.

``MyFn`` is a class; the operator makes one instance, ``MyFn(**params)``, and calls

* ``on_event(event, ctx)`` for each event of a key, and
* ``on_timer(ts, key, ctx)`` (optional) when a timer of that key fires,

with ``ctx`` a :class:`~.process_context.ProcessContext`: ``ctx.key``,
``ctx.emit(x)``, ``ctx.state`` (the key's dict), ``ctx.timers.at(ts)`` /
``ctx.timers.cancel(ts)`` (event time, ms), ``ctx.timers.after(seconds)``
(processing time), ``ctx.watermark``. Everything a function keeps goes in
``ctx.state``: the instance is remade on every copy and restore. A plug-in
registers a function by name with :meth:`Process.named`.

Order (what makes the output independent of batching, copies and moves): events
wait until the watermark passes them and are then handled by ``ts`` (equal
timestamps in arrival order); an event-time timer at ``T`` fires after every
event with ``ts <= T`` and before any later one, so a key sees its events and
timers in timestamp order. A timer set at or before the time being handled
fires next. The end of the stream fires every event-time timer left.
Processing-time timers fire at the first batch or watermark after they are due
(there is no clock thread) and do not fire at the end of the stream.

``ttl="10m"`` (event time): a key's state is emptied when it has had no event
for that long, that is before anything of that key at ``ts >= last event + ttl``
is handled; its timers stay. Late events (``ts <= watermark`` on arrival) go to
the ``late`` side output; an ``on_event`` that raises dead-letters its event, an
``on_timer`` that raises dead-letters ``{"timer": ts, "key": key}``; the stream
goes on, with what the call had already changed in the state kept.

State: each key's record (its state dict, its event-time and processing-time timers)
lives in the deployment's keyed state backend (``pescheduler.state``: memory or disk),
read before a call and put back after it (a key whose record is empty holds nothing).
The firing order needs an index in memory: two heaps of ``(due, key)``, rebuilt from
the records at a restore or an import; an entry whose timer was cancelled or moved
away is skipped when it comes up, so a timer fires exactly once.

KEYED: a snapshot holds whole key groups; ``export_groups``/``import_groups`` (a
rescale, pescheduler/worker/handover.py) and ``split_state``/``merge_states`` move
each key group with its keys' state, pending timers and waiting events, so every
timer fires exactly once across Replicate, Release, Move and restores from a
checkpoint.
"""

from __future__ import annotations

import time
from operator import itemgetter
from typing import Any, Callable

from pescheduler.operator import MIN_WATERMARK, Emitter, Operator, OperatorContext, Parallelism
from pescheduler.timeutil import parse_duration

from pescheduler.state import MemoryState, adopt, key_group, pack_group
from pescheduler.state.groups import add_groups, merge_groups, restore_groups, snapshot_groups, split_groups, take_groups

from .process_context import KeyRecord, ProcessContext, TimerQueue
from .window import hold, key_getter, released


class Process(Operator):
    """Runs a process function per key; see the module docstring."""

    name = "process"
    parallelism = Parallelism.KEYED
    outputs = ("late",)

    def __init__(self, fn: type, params: dict | None = None, ttl: Any = None,
                 key: str | Callable | None = None, ts_field: str = "ts") -> None:
        if not isinstance(fn, type) or not callable(getattr(fn, "on_event", None)):
            raise TypeError(f"process: fn must be a class with on_event(event, ctx), got {fn!r}")
        self.function = fn(**(params or {}))
        self._on_timer = getattr(self.function, "on_timer", None)
        self.ttl = None if ttl is None else parse_duration(ttl)
        self.key, self.ts_field = key, ts_field
        self._key_of = key_getter(key)
        self._wm = MIN_WATERMARK
        self._pending: list = []             # (ts, key, event) not yet passed by the watermark
        self._keys = MemoryState()           # key -> KeyRecord; the deployment's backend from open()
        self._events, self._wall = TimerQueue(), TimerQueue()
        self._ctx = ProcessContext(self._events, self._wall)
        self._due: KeyRecord | None = None   # the record of the timer pop_due just found pending
        # memory: the records put since the last snapshot (KeyedState.writable: read and changed in
        # place with no get or put), asked for at each batch and watermark; disk: None
        self._written: dict | None = None

    @classmethod
    def named(cls, name: str, fn: type) -> type:
        """An operator class that runs ``fn`` under the registry name ``name``, for a plug-in to
        return from ``pescheduler_operators``; apps then write ``key_by(k).process(name, **params)``.
        Assign it to the module-level name it has, ``<fn>Process``, so workers import it by name."""
        def __init__(self, ttl: Any = None, key: str | Callable | None = None, ts_field: str = "ts",
                     **params: Any) -> None:
            cls.__init__(self, fn, params, ttl, key, ts_field)

        return type(f"{fn.__name__}Process", (cls,), {"name": name, "__init__": __init__,
                                                        "__module__": fn.__module__, "__doc__": fn.__doc__})

    def _index(self, groups) -> None:
        """Push the timers of the keys of ``groups`` onto the heaps (a restore, an import)."""
        keys, events, wall = self._keys, self._events, self._wall
        for g in groups:
            for k, record in keys.items(g):
                for ts in sorted(record.timers):
                    events.push(ts, k)
                for due in sorted(record.ptimers):
                    wall.push(due, k)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self.key is None:
            if context.key_field is None:
                raise ValueError("process needs a keyed stream: key_by(field) before process(...)")
            self._key_of = key_getter(context.key_field)
        self._keys = adopt(context, self._keys)

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        self._written = self._keys.writable()
        hold(batch, emit, self.ts_field, self._wm, self._pending, self._key_of)
        self._fire_processing(emit)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        """Events and event-time timers up to ``watermark``, merged in timestamp order."""
        self._wm = self._ctx.watermark = watermark
        self._written = self._keys.writable()
        ready, self._pending = released(self._pending, watermark)
        for ts, k, t in ready:
            self._fire_events(lambda due, ts=ts: due < ts, emit)
            self._event(ts, k, t, emit)
        self._fire_events(lambda due: due <= watermark, emit)
        self._fire_processing(emit)
        self._expire(watermark)

    # -- calls into the function ------------------------------------------------------------
    def _enter(self, k: Any, ts: int, emit: Emitter, domain: str = "event",
               record: KeyRecord | None = None) -> ProcessContext:
        """Point the context at key ``k`` at time ``ts`` and at its record (read from the backend
        unless given); empty the key's state if it outlived ttl."""
        ctx = self._ctx
        ctx.key, ctx.timestamp, ctx.emit, ctx.domain = k, ts, emit, domain
        if record is None:              # inlined _record: this runs per event
            written = self._written
            record = written.get(k) if written is not None else None
            if record is None:
                record = self._keys.get(k)
        if record is not None and self.ttl is not None and domain == "event" and ts - record.last >= self.ttl:
            record.state.clear()
        ctx.current, self._held = record, record is not None
        return ctx

    def _leave(self, k: Any) -> None:
        """Put the key's record back after a call (a copy on disk), or forget it when empty."""
        record, ctx = self._ctx.current, self._ctx
        ctx.current = None
        if record is None:
            return
        if not record.empty():
            written = self._written
            if written is None or written.get(k) is not record:     # memory: already put since the snapshot
                self._keys.put(k, record)
        elif self._held:
            self._keys.delete(k)

    def _event(self, ts: int, k: Any, t: Any, emit: Emitter) -> None:
        ctx = self._enter(k, ts, emit)
        try:
            self.function.on_event(t, ctx)
        except Exception as exc:
            emit.dead_letter(t, exc)
        if self.ttl is not None and ctx.current is not None:
            ctx.current.last = ts
        self._leave(k)

    def _timer(self, ts: int, k: Any, emit: Emitter, domain: str) -> None:
        record, self._due = self._due, None
        (record.timers if domain == "event" else record.ptimers).discard(ts)
        ctx = self._enter(k, ts, emit, domain, record)
        try:
            if self._on_timer is not None:
                self._on_timer(ts, k, ctx)
        except Exception as exc:
            emit.dead_letter({"timer": ts, "key": k}, exc)
        self._leave(k)

    def _fire_events(self, due: Callable[[int], bool], emit: Emitter) -> None:
        """Every event-time timer ``due``, earliest first (a timer set meanwhile included)."""
        while (hit := self._events.pop_due(due, self._holds_timer)) is not None:
            self._timer(hit[0], hit[1], emit, "event")

    def _fire_processing(self, emit: Emitter) -> None:
        now = int(time.time() * 1000)
        while (hit := self._wall.pop_due(lambda due: due <= now, self._holds_ptimer)) is not None:
            self._timer(hit[0], hit[1], emit, "processing")

    def _record(self, k: Any) -> KeyRecord | None:
        """``k``'s record: the one put since the snapshot (memory), else the backend's."""
        written = self._written
        record = written.get(k) if written is not None else None
        return record if record is not None else self._keys.get(k)

    def _holds_timer(self, k: Any, ts: int) -> bool:
        record = self._record(k)
        if record is not None and ts in record.timers:
            self._due = record              # _timer calls with it: one read of the backend
            return True
        return False

    def _holds_ptimer(self, k: Any, due: int) -> bool:
        record = self._record(k)
        if record is not None and due in record.ptimers:
            self._due = record
            return True
        return False

    def _expire(self, watermark: int) -> None:
        """Free the state of keys idle for ``ttl`` by ``watermark`` (memory only: ``_enter`` already
        hides it from the function). A scan, bounded to one per ``ttl`` of event time."""
        if self.ttl is None or watermark < getattr(self, "_next_sweep", MIN_WATERMARK):
            return
        self._next_sweep = watermark + self.ttl
        keys, ttl = self._keys, self.ttl
        for g in keys.groups():
            idle = [k for k, r in keys.items(g) if r.state and watermark - r.last >= ttl]
            for k in idle:
                record = keys.get(k)            # not a view's object (memory) / a copy (disk)
                record.state.clear()
                keys.delete(k) if record.empty() else keys.put(k, record)

    # -- state ------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Waiting events, every key group's records (state and timers), and the watermark; the
        timer heaps are rebuilt from the records at a restore."""
        return {"watermark": self._wm, "pending": list(self._pending), "groups": snapshot_groups(self._keys)}

    def restore(self, state: dict) -> None:
        self._wm, self._pending = state["watermark"], list(state["pending"])
        self._ctx.watermark = self._wm
        restore_groups(self._keys, _groups(state))
        self._events.keep(lambda k: False)
        self._wall.keep(lambda k: False)
        self._index(self._keys.groups())

    # -- copies: key groups move with their records and waiting events ----------------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their
        records and waiting events in :meth:`snapshot`'s form, removed here with their timers;
        the groups that stay are not read, the moving ones packed only when the part is pickled."""
        taken = take_groups(self._keys, groups)
        stays = lambda k: key_group(k) not in groups        # noqa: E731
        self._events.keep(stays)
        self._wall.keep(stays)
        leaving = [p for p in self._pending if not stays(p[1])]
        self._pending = [p for p in self._pending if stays(p[1])]
        return {"watermark": self._wm, "pending": leaving,
                "groups": taken}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported (:meth:`export_groups`) join this running one, their
        timers onto the heaps; its own watermark stays (the events handed over wait for the next)."""
        add_groups(self._keys, state["groups"])
        self._index(state["groups"])
        self._pending = sorted(self._pending + list(state["pending"]), key=itemgetter(0))

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(key)``: their records and waiting events."""
        return {**state, "pending": [p for p in state["pending"] if owns(p[1])],
                "groups": split_groups(_groups(state), owns)}

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups (disjoint) at the least advanced watermark."""
        return {"watermark": min(s["watermark"] for s in states),
                "pending": sorted((p for s in states for p in s["pending"]), key=itemgetter(0)),
                "groups": merge_groups([_groups(s) for s in states])}


def _groups(state: dict) -> dict:
    """A snapshot's key groups; one a checkpoint took while each key's record was in a dict of the
    operator's own (``keys``: ``(key, record)`` pairs) is grouped here, so it still restores."""
    if "groups" in state:
        return state["groups"]
    by_group: dict[int, list] = {}
    for k, record in state["keys"]:
        by_group.setdefault(key_group(k), []).append((k, KeyRecord.load(record)))
    return {g: (items[0][0], pack_group(items)) for g, items in by_group.items()}

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

KEYED: ``split_state``/``merge_states`` move each key with its state, its pending
timers and its waiting events, so every timer fires exactly once across
Replicate, Release, Move and restores from a checkpoint.
"""

from __future__ import annotations

import time
from operator import itemgetter
from typing import Any, Callable

from pescheduler.operator import MIN_WATERMARK, Emitter, Operator, OperatorContext, Parallelism
from pescheduler.timeutil import parse_duration

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
        self._reset({})

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

    def _reset(self, records: dict) -> None:
        """Install ``records`` (key -> KeyRecord) and rebuild the timer queues from them."""
        self._records = records
        self._events, self._wall = TimerQueue(), TimerQueue()
        self._ctx = ProcessContext(records, self._events, self._wall)
        for k, record in records.items():
            for ts in sorted(record.timers):
                self._events.push(ts, k)
            for due in sorted(record.ptimers):
                self._wall.push(due, k)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        if self.key is None:
            if context.key_field is None:
                raise ValueError("process needs a keyed stream: key_by(field) before process(...)")
            self._key_of = key_getter(context.key_field)

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        hold(batch, emit, self.ts_field, self._wm, self._pending, self._key_of)
        self._fire_processing(emit)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        """Events and event-time timers up to ``watermark``, merged in timestamp order."""
        self._wm = self._ctx.watermark = watermark
        ready, self._pending = released(self._pending, watermark)
        for ts, k, t in ready:
            self._fire_events(lambda due, ts=ts: due < ts, emit)
            self._event(ts, k, t, emit)
        self._fire_events(lambda due: due <= watermark, emit)
        self._fire_processing(emit)
        self._expire(watermark)

    # -- calls into the function ------------------------------------------------------------
    def _enter(self, k: Any, ts: int, emit: Emitter, domain: str = "event") -> ProcessContext:
        """Point the context at key ``k`` at time ``ts``; empty the key's state if it outlived ttl."""
        ctx = self._ctx
        ctx.key, ctx.timestamp, ctx.emit, ctx.domain = k, ts, emit, domain
        record = self._records.get(k)
        if record is not None and self.ttl is not None and domain == "event" and ts - record.last >= self.ttl:
            record.state.clear()
        return ctx

    def _event(self, ts: int, k: Any, t: Any, emit: Emitter) -> None:
        ctx = self._enter(k, ts, emit)
        try:
            self.function.on_event(t, ctx)
        except Exception as exc:
            emit.dead_letter(t, exc)
        if self.ttl is not None and k in self._records:
            self._records[k].last = ts
        ctx.release()

    def _timer(self, ts: int, k: Any, emit: Emitter, domain: str) -> None:
        ctx = self._enter(k, ts, emit, domain)
        try:
            if self._on_timer is not None:
                self._on_timer(ts, k, ctx)
        except Exception as exc:
            emit.dead_letter({"timer": ts, "key": k}, exc)
        ctx.release()

    def _fire_events(self, due: Callable[[int], bool], emit: Emitter) -> None:
        """Every event-time timer ``due``, earliest first (a timer set meanwhile included)."""
        while (hit := self._events.pop_due(due, self._holds_timer)) is not None:
            ts, k = hit
            self._records[k].timers.discard(ts)
            self._timer(ts, k, emit, "event")

    def _fire_processing(self, emit: Emitter) -> None:
        now = int(time.time() * 1000)
        while (hit := self._wall.pop_due(lambda due: due <= now, self._holds_ptimer)) is not None:
            due, k = hit
            self._records[k].ptimers.discard(due)
            self._timer(due, k, emit, "processing")

    def _holds_timer(self, k: Any, ts: int) -> bool:
        record = self._records.get(k)
        return record is not None and ts in record.timers

    def _holds_ptimer(self, k: Any, due: int) -> bool:
        record = self._records.get(k)
        return record is not None and due in record.ptimers

    def _expire(self, watermark: int) -> None:
        """Free the state of keys idle for ``ttl`` by ``watermark`` (memory only: ``_enter`` already
        hides it from the function). A scan, bounded to one per ``ttl`` of event time."""
        if self.ttl is None or watermark < getattr(self, "_next_sweep", MIN_WATERMARK):
            return
        self._next_sweep = watermark + self.ttl
        for k in [k for k, r in self._records.items() if watermark - r.last >= self.ttl]:
            record = self._records[k]
            record.state.clear()
            if record.empty():
                del self._records[k]

    # -- state ------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Waiting events, every key's state and timers, and the watermark."""
        return {"watermark": self._wm, "pending": list(self._pending),
                "keys": [(k, r.dump()) for k, r in self._records.items()]}

    def restore(self, state: dict) -> None:
        self._wm, self._pending = state["watermark"], list(state["pending"])
        self._ctx.watermark = self._wm
        self._reset({k: KeyRecord.load(r) for k, r in state["keys"]})

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The keys where ``owns(key)``: their state, timers and waiting events."""
        return {**state, "pending": [p for p in state["pending"] if owns(p[1])],
                "keys": [(k, r) for k, r in state["keys"] if owns(k)]}

    def merge_states(self, states: list) -> dict:
        """Every instance's keys (disjoint) at the least advanced watermark."""
        return {"watermark": min(s["watermark"] for s in states),
                "pending": sorted((p for s in states for p in s["pending"]), key=itemgetter(0)),
                "keys": [kv for s in states for kv in s["keys"]]}

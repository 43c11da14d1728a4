"""What a process function sees of its key: ``ctx.key``, ``ctx.state``, ``ctx.timers``, ``ctx.emit``.

One :class:`KeyRecord` per key holds that key's state dict and pending timers; the
operator keeps it in the deployment's keyed state backend (``pescheduler.state``) and
only while one of them is non-empty, so a key whose state is empty and which waits
for no timer holds nothing. :class:`ProcessContext` is the one object the operator
hands to every call, pointed at the key of the moment and at its record (read from
the backend before the call, put back after it), so a call costs no allocation. The
operator (``process.py``) owns the order in which calls happen; this module only
records what a call asked for.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Callable


@dataclass(slots=True)
class KeyRecord:
    """One key's state, its event-time and processing-time timers, and its last event's time."""

    state: dict = field(default_factory=dict)
    timers: set = field(default_factory=set)        # event time, ms
    ptimers: set = field(default_factory=set)       # processing time, ms since the epoch
    last: int = 0                                   # ts of the key's latest event (for ttl)

    def empty(self) -> bool:
        return not (self.state or self.timers or self.ptimers)

    def dump(self) -> tuple:
        """A picklable copy for a snapshot (the state dict shallow-copied)."""
        return dict(self.state), sorted(self.timers), sorted(self.ptimers), self.last

    @classmethod
    def load(cls, dumped: tuple) -> "KeyRecord":
        state, timers, ptimers, last = dumped
        return cls(dict(state), set(timers), set(ptimers), last)


class TimerQueue:
    """``(ts, seq, key)`` in a heap: the next timer of any key; cancelled entries are skipped
    when they come up (``pop_due`` checks the key's record), so cancel costs no heap search."""

    def __init__(self) -> None:
        self._heap: list = []
        self._seq = count()

    def push(self, ts: int, key: Any) -> None:
        heapq.heappush(self._heap, (ts, next(self._seq), key))

    def keep(self, holds: Callable[[Any], bool]) -> None:
        """Forget the timers of the keys ``holds`` rejects (their key groups moved away)."""
        self._heap = [entry for entry in self._heap if holds(entry[2])]
        heapq.heapify(self._heap)

    def pop_due(self, due: Callable[[int], bool], pending: Callable[[Any, int], bool]) -> tuple | None:
        """The earliest ``(ts, key)`` for which ``due(ts)`` and ``pending(key, ts)``, removed; else None."""
        heap = self._heap
        while heap and due(heap[0][0]):
            ts, _, key = heapq.heappop(heap)
            if pending(key, ts):
                return ts, key
        return None


class Timers:
    """``ctx.timers``: set and cancel the current key's timers."""

    def __init__(self, ctx: "ProcessContext") -> None:
        self._ctx = ctx

    def at(self, ts: int) -> None:
        """Call ``on_timer(ts, key, ctx)`` once the watermark reaches ``ts`` (event time, ms)."""
        ctx = self._ctx
        timers = ctx.record().timers
        if ts not in timers:
            timers.add(ts)
            ctx.event_queue.push(ts, ctx.key)

    def cancel(self, ts: int) -> None:
        """Forget the event-time timer at ``ts`` of this key (no error if there is none)."""
        record = self._ctx.current
        if record is not None:
            record.timers.discard(ts)

    def after(self, seconds: float) -> int:
        """Call ``on_timer`` ``seconds`` of wall-clock time from now (processing time); returns
        the due time in ms since the epoch, the ``ts`` ``on_timer`` will receive."""
        ctx = self._ctx
        due = int(time.time() * 1000 + seconds * 1000)
        ptimers = ctx.record().ptimers
        if due not in ptimers:
            ptimers.add(due)
            ctx.processing_queue.push(due, ctx.key)
        return due


class ProcessContext:
    """The ``ctx`` of ``on_event(event, ctx)`` and ``on_timer(ts, key, ctx)``.

    ``key``: the key of the event or timer; ``state``: that key's dict (kept
    across events, checkpoints, copies and moves; empty it to free it);
    ``timers``: :class:`Timers`; ``emit(x)``: send ``x`` downstream;
    ``watermark``: the event time the stream has completed; ``timestamp``: the
    event's ``ts`` or the timer's; ``domain``: ``"event"`` or ``"processing"``
    (which kind of timer fired, in ``on_timer``).
    """

    def __init__(self, event_queue: TimerQueue, processing_queue: TimerQueue) -> None:
        self.event_queue, self.processing_queue = event_queue, processing_queue
        self.current: KeyRecord | None = None      # the key's record, None until it needs one
        self.timers = Timers(self)
        self.key: Any = None
        self.emit: Callable[[Any], None] = list().append
        self.watermark = 0
        self.timestamp = 0
        self.domain = "event"

    def record(self) -> KeyRecord:
        """The current key's record, made when first needed."""
        record = self.current
        if record is None:
            record = self.current = KeyRecord()
        return record

    @property
    def state(self) -> dict:
        return self.record().state

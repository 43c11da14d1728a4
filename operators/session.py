"""Session windows: per key, events less than ``gap`` apart form one session.

``session_window(gap, aggregates={name: (function, field)})`` (``Stream.window(gap=...)``)
emits one dict per key and session, shaped like a time window's row::

    {"user": "u7", "window_start": 1_000, "window_end": 61_000, "clicks": 12}

Each event opens the interval ``[ts, ts + gap)``; intervals of one key that
overlap merge into one session, so two events are in the same session when
they are *less than* ``gap`` apart (exactly ``gap`` apart: two sessions), and
an out-of-order event that bridges two sessions merges them. A session is
``[first ts, last ts + gap)``, end exclusive, and its aggregates are merged
from those of the sessions it absorbed (nothing is recomputed).

Firing: a session fires when the watermark reaches ``window_end - 1``: no
event still to come (they all have ``ts > watermark``) can extend it. Sessions
that fire together come in order of ``window_end``, then ``window_start``,
then the order their keys opened a session. End of stream fires every session.

Late events: an event with ``ts <= watermark`` on arrival goes to the ``late``
side output. (It could only have extended a session that may have fired.)
Equal timestamps are simply in the same session. A tuple that cannot be
aggregated is dead-lettered alone.
"""

from __future__ import annotations

import heapq
from bisect import insort
from operator import itemgetter
from typing import Any, Callable, Iterable

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import Emitter
from pescheduler.timeutil import parse_duration

from .window import AggregatingWindow


class SessionWindow(AggregatingWindow):
    """Gap-based, merging session windows per key; see the module docstring."""

    name = "session_window"

    def __init__(self, gap: Any, aggregates: dict | None = None, key: str | Callable | None = None,
                 ts_field: str = "ts", queries: dict | None = None) -> None:
        self.gap = parse_duration(gap)
        if self.gap <= 0:
            raise ValueError(f"a session gap must be positive, got gap={gap!r}")
        self._sessions: dict[Any, list] = {}   # key -> [[start, end, slots]] by start, disjoint
        self._seq: dict[Any, int] = {}         # key -> order it opened a session (ties on firing)
        self._by_seq: dict[int, Any] = {}
        self._next_seq = 0
        self._heap: list = []                  # (end, start, seq) to fire; stale entries skipped
        self._wm = MIN_WATERMARK
        self._init_aggregates(aggregates, queries, key, ts_field)

    def _slot_lists(self) -> Iterable[list]:
        return (s[2] for sessions in self._sessions.values() for s in sessions)

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        ts_f, wm, key_of, gap = self.ts_field, self._wm, self._key_of, self.gap
        for t in batch:
            try:
                ts, k = t[ts_f], key_of(t)
                if ts <= wm:
                    emit.to("late", t)
                    continue
                self._place(k, ts, ts + gap, t)
            except Exception as exc:            # _place changes nothing when it raises
                emit.dead_letter(t, exc)

    def _place(self, k: Any, ts: int, end: int, t: Any) -> None:
        """Fold ``t`` into the sessions of ``k`` that ``[ts, end)`` overlaps, merging them."""
        sessions = self._sessions.get(k)
        hit = [s for s in sessions if s[0] < end and ts < s[1]] if sessions else []
        if len(hit) == 1:                       # the common case: extend one session in place
            s = hit[0]
            self._fold(s[2], t)
            if ts < s[0] or end > s[1]:
                s[0], s[1] = min(s[0], ts), max(s[1], end)
                self._schedule(k, s)
            return
        slots = self._fold(None, t)
        for s in hit:
            slots = self._merge(s[2], slots)
        start = min([ts] + [s[0] for s in hit])
        end = max([end] + [s[1] for s in hit])
        if sessions is None:
            sessions = self._sessions[k] = []
            self._seq[k], self._by_seq[self._next_seq] = self._next_seq, k
            self._next_seq += 1
        for s in hit:
            sessions.remove(s)
        session = [start, end, slots]
        insort(sessions, session, key=itemgetter(0))
        self._schedule(k, session)

    def _schedule(self, k: Any, session: list) -> None:
        heapq.heappush(self._heap, (session[1], session[0], self._seq[k]))

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        self._wm = watermark
        heap, out = self._heap, emit.append
        while heap and heap[0][0] - 1 <= watermark:
            end, start, seq = heapq.heappop(heap)
            k = self._by_seq.get(seq)
            sessions = self._sessions.get(k) if seq in self._by_seq else None
            live = [s for s in sessions or () if s[0] == start and s[1] == end]
            if not live:
                continue                        # stale: the session grew or merged since
            sessions.remove(live[0])
            self._emit([(k, live[0][2])], start, end, out)
            if not sessions:
                del self._sessions[k], self._seq[k], self._by_seq[seq]

    # -- state --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Open sessions (slots copied), key order and watermark; the heap is rebuilt."""
        return {"layout": self.plan.layout, "gap": self.gap, "watermark": self._wm,
                "next_seq": self._next_seq,
                "sessions": [(k, self._seq[k], [[a, b, list(s)] for a, b, s in v])
                             for k, v in self._sessions.items()]}

    def restore(self, state: dict) -> None:
        self._check_state(state, gap=self.gap)
        self._wm, self._next_seq = state["watermark"], state["next_seq"]
        self._sessions, self._seq, self._by_seq, self._heap = {}, {}, {}, []
        for k, seq, sessions in state["sessions"]:
            self._sessions[k] = [[a, b, list(s)] for a, b, s in sessions]
            self._seq[k], self._by_seq[seq] = seq, k
            for session in self._sessions[k]:
                self._schedule(k, session)

    # -- copies: key groups move with their sessions ------------------------------------------
    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The sessions of the keys where ``owns(key)``."""
        return {**state, "sessions": [entry for entry in state["sessions"] if owns(entry[0])]}

    def merge_states(self, states: list) -> dict:
        """Every instance's sessions (disjoint keys) at the least advanced watermark; keys are
        renumbered in their old order, so ties on firing still break one way."""
        entries = sorted((e for s in states for e in s["sessions"]), key=itemgetter(1))
        return {**states[0], "watermark": min(s["watermark"] for s in states),
                "next_seq": len(entries),
                "sessions": [(k, seq, sessions) for seq, (k, _, sessions) in enumerate(entries)]}

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

State: each key's ``[seq, sessions]`` lives in the deployment's keyed state backend
(``pescheduler.state``: memory or disk), so a snapshot holds whole key groups and a
rescale moves key groups (docs/state.md): ``export_groups`` takes them out of the backend
and ``import_groups`` adds them, at the cost of the moving groups only. The firing timers (a heap
of session ends) stay in memory: rebuilt from the sessions at a restore, pushed for an import's
groups; the timers of groups that left stay in the heap and are dropped unread when due.

Late events: an event with ``ts <= watermark`` on arrival goes to the ``late``
side output. (It could only have extended a session that may have fired.)
Equal timestamps are simply in the same session. A tuple that cannot be
aggregated is dead-lettered alone.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import insort
from operator import itemgetter
from typing import Any, Callable, Iterable

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import Emitter, OperatorContext
from pescheduler.state import MemoryState, adopt, key_group
from pescheduler.state.groups import (add_groups, merge_groups, restore_groups, snapshot_groups, split_groups,
                                      take_groups, write_batch)
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
        # key -> [seq, [[start, end, slots]] by start, disjoint], seq the order the key opened a
        # session (ties on firing); in memory until open() moves it to the deployment's backend
        self._keys = MemoryState()
        self._next_seq = 0
        self._heap: list = []                  # (end, start, seq, n, key) to fire; stale ones skipped
        self._pushes = itertools.count()       # n: ties of equal seq (merged copies) never compare keys
        self._wm = MIN_WATERMARK
        self._last_end = MIN_WATERMARK         # the latest session end pushed onto the heap
        self._gone: frozenset[int] = frozenset()   # key groups exported whose timers may still be in the heap
        self._gone_until = MIN_WATERMARK       # ... every one of them ends by this
        self._init_aggregates(aggregates, queries, key, ts_field)

    def open(self, context: OperatorContext) -> None:
        super().open(context)
        self._keys = adopt(context, self._keys)

    def _slot_lists(self) -> Iterable[list]:
        """Every slot list; each group's records are put back once changed (disk values are copies)."""
        keys = self._keys
        for g in keys.groups():
            entries = [(k, keys.get(k)) for k, _r in list(keys.items(g))]   # get: not a view's
            for _k, (_seq, sessions) in entries:
                yield from (s[2] for s in sessions)
            keys.write_many(entries)            # the group's keys in one call (disk: one write batch)

    # -- data -------------------------------------------------------------------------
    def process(self, batch: list, emit: Emitter) -> None:
        """On memory a key's record put since the snapshot is changed in place (``writable()``);
        on disk (copies) the batch's keys are read in one ``get_many`` and its records written
        back in one ``write_many`` at its end (:func:`write_batch`), not a call into the store per
        key."""
        ts_f, wm, key_of, gap = self.ts_field, self._wm, self._key_of, self.gap
        written = self._keys.writable()         # memory: records put since the snapshot, in place
        read = None if written is not None else self._read(batch)
        hot = written if read is None else read
        try:
            for t in batch:
                try:
                    ts, k = t[ts_f], key_of(t)
                    if ts <= wm:
                        emit.to("late", t)
                        continue
                    record = hot.get(k)
                    if record is not None:
                        self._place(k, ts, ts + gap, t, record)
                        continue
                    record = self._record(k, read)
                    self._place(k, ts, ts + gap, t, record)
                    self._keep(k, record, read)
                except Exception as exc:            # _place changes nothing when it raises
                    emit.dead_letter(t, exc)
        finally:
            if read is not None:                    # disk: the batch's records go back
                write_batch(self._keys, read)

    def _read(self, batch: list) -> dict:
        """``{key: record}`` the backend holds of the batch's keys (its tuples not late), one ``get_many``."""
        ts_f, wm, key_of, keys = self.ts_field, self._wm, self._key_of, {}
        for t in batch:
            try:
                if t[ts_f] > wm:
                    keys[key_of(t)] = None
            except Exception:                       # dead-lettered by process
                continue
        names = list(keys)
        return {k: record for k, record in zip(names, self._keys.get_many(names)) if record is not None}

    def _record(self, k: Any, read: dict | None) -> list:
        """``k``'s record from the backend (disk: ``read`` holds every one there is), or a new
        one for a new key."""
        record = self._keys.get(k) if read is None else None
        if record is None:
            record = [self._next_seq, []]
            self._next_seq += 1
        return record

    def _keep(self, k: Any, record: list, read: dict | None) -> None:
        """Make ``k``'s record writable in place: put (memory), or the batch's (disk)."""
        if read is None:
            self._keys.put(k, record)
        else:
            read[k] = record

    def _place(self, k: Any, ts: int, end: int, t: Any, record: list) -> None:
        """Fold ``t`` into the sessions of ``k`` that ``[ts, end)`` overlaps, merging them."""
        sessions = record[1]
        hit = [s for s in sessions if s[0] < end and ts < s[1]] if sessions else []
        if len(hit) == 1:                       # the common case: extend one session in place
            s = hit[0]
            self._fold(s[2], t)
            if ts < s[0] or end > s[1]:
                s[0], s[1] = min(s[0], ts), max(s[1], end)
                self._schedule(k, record[0], s)
            return
        slots = self._fold(None, t)
        for s in hit:
            slots = self._merge(s[2], slots)
        start = min([ts] + [s[0] for s in hit])
        end = max([end] + [s[1] for s in hit])
        for s in hit:
            sessions.remove(s)
        session = [start, end, slots]
        insort(sessions, session, key=itemgetter(0))
        self._schedule(k, record[0], session)

    def _schedule(self, k: Any, seq: int, session: list) -> None:
        heapq.heappush(self._heap, (session[1], session[0], seq, next(self._pushes), k))
        if session[1] > self._last_end:
            self._last_end = session[1]

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        """Fire the sessions ``watermark`` closes: their keys read in one ``get_many`` and the
        records they leave written (or deleted, once empty) in one ``write_many``."""
        self._wm = watermark
        heap = self._heap
        due = []
        while heap and heap[0][0] - 1 <= watermark:
            due.append(heapq.heappop(heap))
        if self._gone:                          # timers of exported groups: theirs to fire now
            gone = self._gone
            due = [entry for entry in due if key_group(entry[4]) not in gone]
            if not heap or heap[0][0] > self._gone_until:
                self._gone = frozenset()        # every timer pushed before the export has come
        if not due:
            return
        names = list(dict.fromkeys(entry[4] for entry in due))
        records = dict(zip(names, self._keys.get_many(names)))     # get: a copy where a view shares it
        left: dict = {}                         # key -> its record after the firing, None once empty
        out = emit.append
        try:
            for end, start, _seq, _n, k in due:
                record = records[k]
                live = [s for s in record[1] if s[0] == start and s[1] == end] if record else None
                if not live:
                    continue                    # stale: the session grew or merged since
                record[1].remove(live[0])
                left[k] = record if record[1] else None
                self._emit([(k, live[0][2])], start, end, out)
        finally:
            write_batch(self._keys, left)

    # -- state --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Open sessions as whole key groups (packed: a copy), key order and watermark; the
        timers are rebuilt from the sessions at a restore."""
        return {"layout": self.plan.layout, "gap": self.gap, "watermark": self._wm,
                "next_seq": self._next_seq, "groups": snapshot_groups(self._keys)}

    def restore(self, state: dict) -> None:
        self._check_state(state, gap=self.gap)
        self._wm, self._next_seq = state["watermark"], state["next_seq"]
        restore_groups(self._keys, state["groups"])
        self._heap, self._gone = [], frozenset()   # the timers anew, none of another state's groups
        for g in self._keys.groups():           # the timers: one per open session
            for k, (seq, sessions) in self._keys.items(g):
                for session in sessions:
                    self._schedule(k, seq, session)

    # -- copies: key groups move with their sessions ------------------------------------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """A rescale takes key groups ``groups`` away (pescheduler/worker/handover.py): their
        records in :meth:`snapshot`'s form, taken out of the backend (packed only when the part
        is pickled). Their timers stay in the heap, unread (a pass over it would cost the whole
        state in the PE's turn): until every timer pushed before now has come due, a due timer
        of a group in ``_gone`` is dropped unread."""
        self._gone = self._gone | groups
        self._gone_until = self._last_end
        return {"layout": self.plan.layout, "gap": self.gap, "watermark": self._wm, "next_seq": self._next_seq,
                "groups": take_groups(self._keys, groups)}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported (:meth:`export_groups`, or a lazy restore's part)
        join this running one with their sessions' timers; its own watermark stays. Their old
        timers here, if they left and came back, fire as any stale timer does: only a session
        whose bounds they still match, once."""
        self._check_state(state, gap=self.gap)
        add_groups(self._keys, state["groups"])
        self._gone = self._gone - frozenset(state["groups"])
        self._next_seq = max(self._next_seq, state["next_seq"])
        for g in state["groups"]:
            for k, (seq, sessions) in self._keys.items(g):
                for session in sessions:
                    self._schedule(k, seq, session)

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        """The key groups where ``owns(key)``, with their sessions."""
        return {**state, "groups": split_groups(state["groups"], owns)}

    def merge_states(self, states: list) -> dict:
        """Every instance's key groups (disjoint) at the least advanced watermark; keys keep their
        order numbers (equal ones, of different copies, fire in an order of their own)."""
        return {**states[0], "watermark": min(s["watermark"] for s in states),
                "next_seq": max(s["next_seq"] for s in states),
                "groups": merge_groups([s["groups"] for s in states])}

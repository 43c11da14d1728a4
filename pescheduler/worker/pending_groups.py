"""Key groups an operator instance owns but whose state has not arrived yet (a rescale's move).

A Replicate, Release or Move no longer waits for the moving key groups' state:
the routers switch at once and the gaining instance runs (``handover.py``).
Until a group's state is imported, the tuples of that group wait here, per
group, in arrival order; every other tuple is processed at once. Right after a
group's import its waiting tuples go through the operator, before anything
that arrives later (same turn), so per-key order and exactly once hold: the
old owner processed nothing of the group after the switch, the new one
nothing before its state.

Event time: while any group is pending the instance's watermark does not
advance (a pending hand-over is one more input of the operator's node, at the
minimum watermark and open: ``Chain.hold_input``, which every rewire of the
chain's edges keeps): a window never fires, nor lets downstream see a
watermark past, a group whose panes are still on their way, and no tuple the
gate holds is late when its group arrives. Once the last
group is in, the input goes and the watermark catches up (the windows fire
then, what they held included).

Bounded: while an instance holds more than ``pescheduler.state.hold`` tuples
(100,000 by default; at least a credit window, ``pescheduler.channel.credits``
batches of the PE's batch size), its PE takes no more input that reaches it
(``flow.InputScheduler``, as for a full output channel): its senders wait for
credit, as behind a slow operator, until the groups arrive. A running
exporter's groups leave only once downstream took its marker
(``handover.exported_live``), so the hold lasts as long as the slowest
consumer's backlog: at 20,000 tuples/s into a consumer of 3,300/s the copy held
59,285 tuples in 12 s before any bound. At a credit window (8,000 tuples, the
bound until session 27) a Replicate at 10^7 keys, whose groups take seconds to
arrive, held the whole stream that long: every tuple of the pipeline waited
behind the copy's (gaps of 0.4-4 s between outputs, traced), and a Release right
after it waited for the copy to take its marker the same way (253 ms of a 302 ms
pause).

An operator that tells its inputs apart (``process_input``: the joins,
``lookup``) is gated the same way, its waiting tuples held with the input they
came on and replayed in arrival order across its inputs (one call per run of
one input's tuples): per key, the order it would have seen them in without the
move. A columnar operator (the time window) takes an Arrow batch that comes
while groups are pending as its rows (the window folds rows and columns into
the same panes): vectorised again once the groups are in.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, Iterable

from ..wire import key_group
from .chain import Chain, rows
from .gc_pause import gc_paused
from .routing import key_function

HANDOVER_INPUT = "(handover)"      # the pending groups' place among the node's inputs


class PendingGroups:
    """One gated instance ``op_id`` in ``chain``: tuples of ``groups`` wait until :meth:`arrived`."""

    def __init__(self, chain: Chain, op_id: str, groups: Iterable[int], key: Callable[[Any], Any],
                 tag: str, fresh: bool = False) -> None:
        self.chain, self.op_id, self.key, self.tag = chain, op_id, key, tag
        self.fresh = fresh              # a new instance: built from its first part (restore), not merged
        self.node = chain.nodes[op_id]
        self.waiting: dict[int, list] = {g: [] for g in groups}     # group -> its tuples, arrival order
        self.total = len(self.waiting)
        self.buffered = 0               # tuples that waited (figures, tests)
        self.holding = 0                # tuples waiting now (the PE's input stops above a credit window)
        self.peak = 0                   # the most that waited at once (figures, tests)
        self.bytes = 0                  # state bytes imported so far (the receiving worker counts)
        self.parts = 0                  # parts imported so far (a fresh instance restores the first)
        self.longest_import_s = 0.0     # the longest import of a group in the PE's turn (a stall of its stream)
        self.carried_in = 0             # tuples the giving instance carried over with the groups (figures, tests)
        self.since: dict[int, float] = {}   # group -> sum of its waiting tuples' arrival times (a batch's, s)
        self.waited_s = 0.0             # the tuples' waits added up, arrival to their group's import (figures)
        self.inner = self.node.process
        self.node.process = self.process
        self.inner_input = self.node.process_input      # None: one input (``process``)
        if self.inner_input is not None:    # waiting entries are (input, tuple): by_input_runs
            self.node.process_input = self.process_input
        if self.waiting:                # the node's watermark stays where it is until the last group
            chain.hold_input(op_id, HANDOVER_INPUT)

    @property
    def done(self) -> bool:
        return not self.waiting

    def process(self, batch: list, emit: Any) -> None:
        """The node's ``process`` while groups are pending: theirs wait, the rest go on."""
        if not self.waiting:
            return self.inner(batch, emit)
        if not isinstance(batch, list):     # a columnar operator's Arrow batch: as rows while gated
            batch = rows(batch)
        now = self._hold(batch, None)
        if now:
            self.inner(now, emit)

    def process_input(self, k: int, batch: list, emit: Any) -> None:
        """The node's ``process_input`` while groups are pending: theirs wait with their input."""
        if not self.waiting:
            return self.inner_input(k, batch, emit)
        now = self._hold(batch, k)
        if now:
            self.inner_input(k, now, emit)

    def _hold(self, batch: list, k: int | None) -> list:
        """The tuples of ``batch`` whose group is pending wait (with input ``k``, when the operator
        tells its inputs apart); the others are answered, in order."""
        waiting, key, now, since, at = self.waiting, self.key, [], self.since, time.perf_counter()
        for t in batch:
            g = key_group(key(t))
            queue = waiting.get(g)
            if queue is None:
                now.append(t)
            else:
                queue.append(t if k is None else (k, t))
                since[g] = since.get(g, 0.0) + at
                self.buffered += 1
                self.holding += 1
        self.peak = max(self.peak, self.holding)
        return now

    def waited_for(self) -> list[int]:
        """The pending groups some tuple waits for, the most waited-for first (ties: lowest group):
        the order a move's or a restore's groups are best brought in (Megaphone's fetch on first
        touch)."""
        return sorted((g for g, queue in self.waiting.items() if queue), key=lambda g: (-len(self.waiting[g]), g))

    def carried(self, group: int, tuples: list) -> None:
        """Tuples of ``group`` the instance giving it up had taken in and not processed (a
        released copy's queued input, ``carried_input.py``): ahead of those waiting here, which
        its router sent after the switch, so they go through right after the group's state."""
        if not tuples:
            return
        if self.inner_input is not None:    # plan/state.py's ``carries``: one input only
            raise RuntimeError(f"{self.op_id} reads several inputs: no input is carried to it")
        self.waiting[group][:0] = tuples
        self.since[group] = self.since.get(group, 0.0) + len(tuples) * time.perf_counter()
        self.buffered += len(tuples)
        self.holding += len(tuples)
        self.carried_in += len(tuples)
        self.peak = max(self.peak, self.holding)

    def install(self, groups: Iterable[int], load: Callable[[], Any]) -> float:
        """``load()`` (the import of ``groups``' state, in the PE's turn: the caller holds its lock)
        with the collector paused, then :meth:`arrived`: the one way a lazy restore's group and a
        rescale's part go in. Answers the seconds it took (a stall of the PE's stream:
        ``longest_import_s``)."""
        started = time.perf_counter()
        gc_paused(load)
        took = time.perf_counter() - started
        self.longest_import_s = max(self.longest_import_s, took)
        self.arrived(groups)
        return took

    def arrived(self, groups: Iterable[int]) -> None:
        """``groups``' state was just imported (same turn): their tuples go through the operator
        now, in arrival order; after the last group, the watermark and end of stream it held."""
        chain, node, at = self.chain, self.node, time.perf_counter()
        for g in sorted(groups):
            queue = self.waiting.pop(g, None)
            if queue:
                self.holding -= len(queue)
                self.waited_s += len(queue) * at - self.since.pop(g, 0.0)
                if self.inner_input is None:
                    chain.replay(node, self.inner, queue)
                else:
                    for k, run in by_input_runs(queue):
                        chain.replay(node, partial(self.inner_input, k), run)
        if self.waiting:
            return
        node.process = self.inner
        if self.inner_input is not None:
            node.process_input = self.inner_input
        chain.release_input(self.op_id, HANDOVER_INPUT)

    def figures(self) -> dict:
        return {"groups": self.total, "pending": len(self.waiting), "buffered": self.buffered,
                "peak": self.peak, "bytes": self.bytes, "longest_import_s": self.longest_import_s,
                "carried": self.carried_in, "waited_s": self.waited_s}


def by_input_runs(queue: list[tuple[int, Any]]) -> list[tuple[int, list]]:
    """``(input, tuple)`` entries in arrival order -> ``(input, tuples)`` runs of one input each."""
    runs: list[tuple[int, list]] = []
    for k, t in queue:
        if runs and runs[-1][0] == k:
            runs[-1][1].append(t)
        else:
            runs.append((k, [t]))
    return runs


def over_window(gates: dict[str, PendingGroups], window: int) -> frozenset[str]:
    """The gated instances holding more than ``window`` tuples: their PE takes no more input that
    reaches them until their groups arrive (``flow.InputScheduler.flush``)."""
    return frozenset(op_id for op_id, g in gates.items() if g.holding > window)


def awaited(chain: Chain, spec: Any) -> dict[str, PendingGroups]:
    """A new PE's instances whose key groups are still on their way (``spec.restore``'s
    hand-over entries, ``control/protocol.py``): gated before the PE takes its first tuple."""
    return {op_id: PendingGroups(chain, op_id, saved["groups"], key_function(spec.ops[op_id][2]),
                                 saved["handover"], fresh=True)
            for op_id, saved in spec.restore.items() if placeholder(saved)}


def placeholder(saved: dict) -> bool:
    """A restore entry that names key groups handed over later, not state (``awaited``)."""
    return "handover" in saved

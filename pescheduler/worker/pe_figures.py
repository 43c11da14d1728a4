"""The figures of one PE's run that its stats report (``PERunner.stats``) and nothing in the run
reads: when it started, the wall clock of its first input, how long it sat idle, the side
outputs nobody consumes, and its operators' counters. The controller turns the cumulative
counters into rates and fractions (control/monitor.py).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from time import perf_counter
from typing import Any, Iterator

from .source_driver import SourceDriver


class RunFigures:
    """Times and counts of one PE's run, kept as it goes."""

    def __init__(self) -> None:
        self.started_at = 0.0
        self.first_input_at: float | None = None   # wall clock of the first batch in (copy activation)
        self.idle_s = 0.0
        self._idle_since: float | None = None      # when the current idle wait began
        self.side_counts: dict[str, int] = {}

    def start(self) -> None:
        self.started_at = perf_counter()

    def input_came(self) -> None:
        """A data batch came in (per batch: one comparison once the first one came)."""
        if self.first_input_at is None:
            self.first_input_at = time.time()

    def side(self, op_id: str, port: str, items: list) -> None:
        """A side output nobody consumes (e.g. late events): counted, kept for the controller."""
        key = f"{op_id}.{port}"
        self.side_counts[key] = self.side_counts.get(key, 0) + len(items)

    @contextmanager
    def waiting(self, blocked: Any) -> Iterator[None]:
        """The PE waits for something to do: idle time, unless the flow holds input back for a
        full output channel (``blocked``, that channel's gate), whose wait is backpressure and
        counted by the gate (flow.py's ``holding_back``)."""
        if blocked is not None:
            blocked.begin_wait()
            try:
                yield
            finally:
                blocked.end_wait()
            return
        t0 = self._idle_since = perf_counter()
        try:
            yield
        finally:
            self.idle_s += perf_counter() - t0
            self._idle_since = None

    def stats(self) -> dict:
        now, since = perf_counter(), self._idle_since
        return {"elapsed_s": now - self.started_at if self.started_at else 0.0,
                "idle_s": self.idle_s + (now - since if since else 0.0),
                "first_input_at": self.first_input_at, "side": dict(self.side_counts)}


def operator_figures(chain: Any, sources: list[SourceDriver]) -> dict[str, dict]:
    """Each operator's counters (none before the PE built its chain); a source's tuples out and
    its lag (records behind, per partition) are its driver's."""
    if chain is None:
        return {}
    ops = {}
    for op_id, node in chain.nodes.items():
        s = node.stats
        ops[op_id] = {"tuples_in": s.tuples_in, "tuples_out": s.tuples_out, "batches_in": s.batches_in,
                      "busy_s": s.busy_s, "dead_letters": s.dead_letters, "side": dict(s.side)}
    for driver in sources:
        ops[driver.op_id]["tuples_out"] = driver.count
        if driver.lag is not None and not driver.ended:
            ops[driver.op_id]["lag"] = driver.lag()
    return ops

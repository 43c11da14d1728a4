"""A columnar source's reads that are ready at once, gathered into one Arrow batch: the framework,
not the source, sizes the batches its operators see.

A source hands over whatever batch it has: a poll, a file's row group, the
10,000 rows a device sent. Every batch costs the chain a fixed amount besides
its rows (each operator's call, each expression kernel's dispatch, the window's
pane search, the source's event-time stamping, a watermark through every
operator): with 10 k-row batches that was about 30 % of the connected-car
pipeline's time in-process (bench/columnar.py, docs/expressions.md). So the
driver reads on while the source has more ready and hands the chain one batch
of up to ``max_rows`` rows.

No tuple waits for data that is not there: gathering stops at the first read
that returns nothing (or the end, which is then delivered by the next read),
and once the reads have taken ``budget_s`` on the busy clock (``busy.py``: time
spent waiting for a CPU is not the reads'; on the time passed, a loaded machine's
preemptions ended gatherings early and the chain got 20-30 k-row batches among
its 70 k ones): the share of the deployment's
latency target (``deploy(latency=)``, ``pescheduler.batch.latency``) a
channel's batch aims to fill (``channels.FILL``, half), so a slow source's
first rows are not held back longer by its later ones than a channel would
hold them; a target of 0 (never wait) gathers nothing. Only Arrow batches
with the schema of the first are joined; a row batch or another schema is
held for the next read. A held batch has left the source (its position is
past it), so it is part of the driver's snapshot: :meth:`Gather.snapshot`.
Batches with different dictionaries are joined with their dictionaries unified
(``pa.concat_batches``, ``pa.Table.combine_chunks`` before pyarrow 19).
"""

from __future__ import annotations

from typing import Any, Callable

from .busy import busy_clock
from .channels import FILL

MAX_ROWS = 65_536          # rows at which a batch's fixed cost is a few % of its time (docs/expressions.md)
_END = object()            # held: the source ended after the rows handed over


class Gather:
    """``read()`` -> a batch (list, RecordBatch, maybe empty) or None at the end, as ``Source.read``."""

    def __init__(self, read: Callable[[], Any], max_rows: int = MAX_ROWS, budget_s: float = 0.0005,
                 clock: Callable[[], float] = busy_clock) -> None:
        self._read, self.max_rows, self.budget_s, self.clock = read, max_rows, budget_s, clock
        self.held: Any = None      # a read kept for the next call (another schema, or the end)

    @classmethod
    def within(cls, read: Callable[[], Any], latency_s: float) -> "Gather":
        """Reads gathered for as long as a channel fills a batch under the latency target ``latency_s``."""
        return cls(read, budget_s=latency_s * FILL)

    def read(self) -> Any:
        first = self._take()
        if not _arrow_batch(first) or first.num_rows >= self.max_rows or not first.num_rows:
            return first
        parts, rows, schema = [first], first.num_rows, first.schema
        clock = self.clock
        deadline = clock() + self.budget_s
        while rows < self.max_rows and clock() < deadline:
            more = self._read()
            if more is None:
                self.held = _END
                break
            if not _arrow_batch(more) or not more.schema.equals(schema):
                if len(more):
                    self.held = more
                break
            if not more.num_rows:                 # nothing ready now
                break
            parts.append(more)
            rows += more.num_rows
        return parts[0] if len(parts) == 1 else _joined(parts)

    def _take(self) -> Any:
        held, self.held = self.held, None
        if held is None:
            return self._read()
        return None if held is _END else held

    def snapshot(self) -> Any:
        """The held batch (it is no longer at the source), for the driver's snapshot."""
        return {"end": True} if self.held is _END else {"batch": self.held}

    def restore(self, saved: Any) -> None:
        self.held = _END if saved.get("end") else saved.get("batch")


def _arrow_batch(batch: Any) -> bool:
    """A ``pyarrow.RecordBatch`` (checked by name: pyarrow is not imported for row sources)."""
    return type(batch).__name__ == "RecordBatch"


def _joined(parts: list) -> Any:
    import pyarrow as pa

    if hasattr(pa, "concat_batches"):            # pyarrow >= 19: a third faster than the table's way (L)
        return pa.concat_batches(parts)
    return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

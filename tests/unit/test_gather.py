"""pescheduler.worker.gather: a columnar source's ready reads joined into one batch, nothing held back
that was not ready, nothing lost (the end, another schema, a snapshot in between)."""

from __future__ import annotations

import pyarrow as pa

from pescheduler.worker.busy import busy_clock
from pescheduler.worker.gather import Gather


def _batch(start: int, rows: int, keys: list | None = None) -> pa.RecordBatch:
    keys = keys or ["a", "b", "c"]
    idx = pa.array([i % len(keys) for i in range(start, start + rows)], pa.int32())
    return pa.RecordBatch.from_arrays([pa.DictionaryArray.from_arrays(idx, pa.array(keys)),
                                       pa.array(range(start, start + rows), pa.int64())], ["k", "ts"])


class Reads:
    """A source's reads, in order; counts the calls."""

    def __init__(self, *reads) -> None:
        self.reads, self.calls = list(reads), 0

    def __call__(self):
        self.calls += 1
        return self.reads.pop(0) if self.reads else None


def test_ready_batches_go_out_as_one_up_to_the_row_target():
    reads = Reads(*(_batch(i * 10, 10) for i in range(10)))
    gather = Gather(reads, max_rows=35, budget_s=60)
    first = gather.read()
    assert first.num_rows == 40 and reads.calls == 4              # stops once 35 rows are reached
    assert first.column("ts").to_pylist() == list(range(40))
    assert first.column("k").to_pylist() == [("a", "b", "c")[i % 3] for i in range(40)]
    assert gather.read().column("ts").to_pylist() == list(range(40, 80))


def test_gathering_stops_at_the_first_read_with_nothing_ready():
    empty = _batch(0, 0)
    reads = Reads(_batch(0, 10), _batch(10, 10), empty, _batch(20, 10))
    gather = Gather(reads, max_rows=1000, budget_s=60)
    assert gather.read().column("ts").to_pylist() == list(range(20))
    assert reads.calls == 3                                       # no read past the empty one
    assert gather.read().column("ts").to_pylist() == list(range(20, 30))


def test_the_end_comes_after_the_rows_read_before_it():
    gather = Gather(Reads(_batch(0, 10), _batch(10, 10)), max_rows=1000, budget_s=60)
    assert gather.read().num_rows == 20
    assert gather.read() is None


def test_no_budget_no_second_read():
    reads = Reads(_batch(0, 10), _batch(10, 10))
    assert Gather(reads, max_rows=1000, budget_s=0).read().num_rows == 10 and reads.calls == 1


def test_the_budget_counts_the_reads_busy_time_not_a_wait_for_a_cpu():
    """The budget is on the busy clock (time passed minus time waiting for a CPU): on the time passed,
    a read preempted on a loaded machine ended the gathering, and the chain got a 20-30 k-row batch
    among its 70 k ones (in 3 of 9 deployed runs at load 8-10, none on the busy clock)."""
    assert Gather(Reads()).clock is busy_clock
    preempted = iter([0.0, 0.0, 5.0, 5.0, 5.0, 5.0])        # the second read waited 5 s for a CPU
    stopped = Gather(Reads(*(_batch(i * 10, 10) for i in range(4))), budget_s=1, clock=lambda: next(preempted))
    assert stopped.read().num_rows == 20
    busy = Gather(Reads(*(_batch(i * 10, 10) for i in range(4))), budget_s=1, clock=lambda: 0.0)
    assert busy.read().num_rows == 40


def test_dictionaries_are_unified_when_joined():
    gather = Gather(Reads(_batch(0, 3, ["a", "b", "c"]), _batch(0, 3, ["c", "x", "a"])), budget_s=60)
    assert gather.read().column("k").to_pylist() == ["a", "b", "c", "c", "x", "a"]


def test_another_schema_is_held_for_the_next_read_and_kept_in_a_snapshot():
    other = pa.RecordBatch.from_arrays([pa.array([1.5])], ["speed"])
    gather = Gather(Reads(_batch(0, 10), other, _batch(10, 10)), max_rows=1000, budget_s=60)
    assert gather.read().num_rows == 10
    saved = gather.snapshot()                                    # the source is past ``other`` now
    restored = Gather(Reads(), budget_s=60)
    restored.restore(saved)
    assert restored.read().equals(other)
    assert gather.read().equals(other)
    end = Gather(Reads(_batch(0, 10)), budget_s=60)
    end.read()
    again = Gather(Reads(_batch(99, 1)), budget_s=60)
    again.restore(end.snapshot())
    assert again.read() is None                                  # the end survives a snapshot too


def test_row_batches_and_big_batches_pass_as_they_are():
    rows, big = [{"ts": 1}], _batch(0, 50)
    reads = Reads(rows, big, _batch(50, 1))
    gather = Gather(reads, max_rows=50, budget_s=60)
    assert gather.read() is rows and gather.read() is big and reads.calls == 2

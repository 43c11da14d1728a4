"""The keyed windows (count, session, over) read a batch's keys from a disk backend in one
``get_many`` and write them in one ``write_many`` (``state.groups.write_batch``), not a call into
the store per tuple or key: a counting wrapper around the real backend sees at most two calls per
batch and per watermark, whatever the number of tuples and keys, while the rows stay those of each
window's plain-Python reference (keys repeating within a batch, sessions firing and their keys
deleted within one watermark, quiet keys swept) on both backends."""

from __future__ import annotations

import random

import pytest

from pescheduler.operator import MAX_WATERMARK, MIN_WATERMARK, Emitter, OperatorContext
from pescheduler.operators.count_window import CountWindow
from pescheduler.operators.over_window import OverWindow
from pescheduler.operators.session import SessionWindow
from test_op_window import AGGS, MAX_DELAY, assert_rows_equal, check_snapshot_midstream
import test_op_window_count
import test_op_window_over
import test_op_window_session


class Counting:
    """The operator's real backend, each call that reads or writes keys noted by name (a scan,
    a snapshot, ``writable()`` go through unnoted)."""

    NOTED = frozenset({"get", "read", "put", "delete", "get_many", "write_many", "delete_many"})

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if name not in self.NOTED:
            return attr

        def noted(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)
        return noted


def stream(n=600, keys=5, seed=3):
    """Events 1 ms apart, up to 8 ms early (some late beyond MAX_DELAY), 5 keys: every batch of 50
    holds each key about ten times."""
    rnd = random.Random(seed)
    return [{"k": f"k{rnd.randrange(keys)}", "v": rnd.randrange(100), "ts": i - rnd.randrange(0, 16)}
            for i in range(n)]


def drive(op, events, batch_size):
    """``events`` through ``op`` in batches, a watermark MAX_DELAY behind the largest ts after
    each (as ``run_operators`` and test_op_window's ``feed`` drive it), then the end; returns the
    output and, per call of the operator, ``(what, the backend calls it made)``."""
    op.open(OperatorContext(op.name, key_field="k"))
    op._keys = state = Counting(op._keys)
    out, calls, wm, top = Emitter(), [], MIN_WATERMARK, MIN_WATERMARK
    for b in range(0, len(events), batch_size):
        batch = events[b:b + batch_size]
        state.calls = []
        op.process(batch, out)
        calls.append(("process", state.calls))
        top = max([top] + [t["ts"] for t in batch])
        if top - MAX_DELAY - 1 > wm:
            wm = top - MAX_DELAY - 1
            state.calls = []
            op.on_watermark(wm, out)
            calls.append(("watermark", state.calls))
    state.calls = []
    op.on_watermark(MAX_WATERMARK, out)
    calls.append(("watermark", state.calls))
    return out, calls


def assert_batched(calls):
    """Each process and each watermark: at most one get_many and one write_many, nothing per key."""
    for what, made in calls:
        assert len(made) <= 2 and set(made) <= {"get_many", "write_many"}, (what, made)


def test_count_window_on_disk_reads_and_writes_a_watermarks_keys_once(backend):
    events = stream()
    out, calls = drive(CountWindow(6, 2, AGGS), events, 50)
    rows, late, _dead = test_op_window_count.reference(events, 50, 6, 2)
    assert_rows_equal(list(out), rows)
    assert out.sides["late"] == late
    if backend == "disk":
        assert_batched(calls)


def test_session_window_reads_and_writes_a_batchs_keys_once(backend):
    events = stream()
    out, calls = drive(SessionWindow(3, AGGS), events, 50)
    rows, late, _dead = test_op_window_session.reference(events, 50, 3)
    in_order = test_op_window_session.in_firing_order
    assert_rows_equal(in_order(list(out)), in_order(rows))
    assert out.sides["late"] == late
    # sessions of a key fire together and its record is emptied and deleted in the same watermark
    assert len(rows) > 2 * len({r["k"] for r in rows})
    watermarks = [made for what, made in calls if what == "watermark"]
    assert_batched([("watermark", made) for made in watermarks])       # both backends: firings
    if backend == "disk":
        assert_batched(calls)


def test_over_window_on_disk_reads_a_watermarks_keys_once(backend):
    events = stream()
    window = OverWindow(8, AGGS)
    out, calls = drive(window, events, 50)
    rows, late, _dead = test_op_window_over.reference(events, 50, 8, AGGS)
    by_event = lambda rs: sorted(rs, key=lambda r: (r["window_end"], r["k"]))   # noqa: E731
    assert_rows_equal(by_event(list(out)), by_event(rows))
    assert out.sides["late"] == late
    assert window.windows() == {}                       # every key swept at the end
    if backend == "disk":
        # a watermark's keys: one get_many, one write_many; a sweep of quiet keys (once per size
        # of event time) one more write_many
        for what, made in calls:
            assert made.count("get_many") <= 1 and set(made) <= {"get_many", "write_many"}, (what, made)
            assert made.count("write_many") <= 2, (what, made)


@pytest.mark.parametrize("make", [lambda: CountWindow(6, 2, AGGS), lambda: SessionWindow(3, AGGS),
                                  lambda: OverWindow(8, AGGS)], ids=["count", "session", "over"])
def test_a_restore_midstream_on_either_backend_goes_on_as_one_run(backend, make):
    """A snapshot taken between two batches (their writes in the store) restored into a fresh
    window: both go on and give what one uninterrupted run gives."""
    check_snapshot_midstream(make, stream(seed=11), 50, 0.5)

"""Count windows against a plain-Python reference on random, out-of-order streams."""

import pytest
from hypothesis import given, settings, strategies as st

from pescheduler.chain import MIN_WATERMARK
from pescheduler.operator import MAX_WATERMARK, Emitter, OperatorContext
from pescheduler.operators.count_window import CountWindow
from pescheduler.testing import run_operators
from test_op_window import AGGS, FUNCS, MAX_DELAY, assert_rows_equal, feed, streams
from test_op_window_session import arrivals


def reference(events, batch_size, count, slide):
    """Good tuples in event-time order (ties: arrival); per key a window every ``slide`` from ``count``."""
    kept, late, dead = arrivals(events, batch_size)
    seen, rows = {}, []
    for t in sorted(kept, key=lambda t: t["ts"]):
        mine = seen.setdefault(t["k"], [])
        mine.append(t)
        if len(mine) >= count and (len(mine) - count) % slide == 0:
            window = mine[-count:]
            values = [w["v"] for w in window]
            rows.append({"k": t["k"], "window_start": window[0]["ts"], "window_end": t["ts"] + 1,
                         **{out: FUNCS[fn](values) for out, (fn, _) in AGGS.items()}})
    return rows, late, dead


shapes = st.sampled_from([(1, 1), (3, 3), (10, 10), (6, 2), (9, 3), (12, 1)])
batch_sizes = st.sampled_from([1, 7, 50, 1000])


@settings(max_examples=60, deadline=None)
@given(streams(poison=True), shapes, batch_sizes)
def test_matches_reference_with_late_events_and_bad_tuples(events, shape, batch_size):
    count, slide = shape
    result = run_operators(events, CountWindow(count, slide, AGGS), batch_size=batch_size,
                           max_delay=MAX_DELAY, key_field="k")
    rows, late, dead = reference(events, batch_size, count, slide)
    assert_rows_equal(result.output, rows)
    assert result.sides.get("late", []) == late
    # bad tuples are found when taken in event-time order, so compare them as a set
    assert sorted(map(id, (d.item for d in result.dead_letters))) == sorted(map(id, dead))


@settings(max_examples=30, deadline=None)
@given(streams(), shapes, st.sampled_from([1, 7, 50]), st.floats(0, 1))
def test_snapshot_restore_midstream_gives_the_same_output(events, shape, batch_size, cut):
    full = run_operators(events, CountWindow(*shape, AGGS), batch_size=batch_size,
                         max_delay=MAX_DELAY, key_field="k")
    batches = [events[b:b + batch_size] for b in range(0, len(events), batch_size)]
    split = int(len(batches) * cut)
    first = CountWindow(*shape, AGGS)
    first.open(OperatorContext("count-1", key_field="k"))
    state = [MIN_WATERMARK, MIN_WATERMARK]
    head = feed(first, batches[:split], state)
    second = CountWindow(**first.parameters())
    second.open(OperatorContext("count-1", key_field="k"))
    second.restore(first.snapshot())
    for window in (first, second):       # both go on: the snapshot must share nothing
        tail = feed(window, batches[split:], list(state))
        window.on_watermark(MAX_WATERMARK, tail)
        assert head + tail == full.output


def test_event_time_order_not_arrival_and_no_partial_window_at_the_end():
    window, out = CountWindow(2, aggregates={"s": ("sum", "v")}, key="k"), Emitter()
    window.process([{"k": "a", "v": 1, "ts": 5}, {"k": "a", "v": 10, "ts": 1},
                    {"k": "a", "v": 100, "ts": 3}], out)
    window.on_watermark(MAX_WATERMARK, out)
    assert out == [{"k": "a", "window_start": 1, "window_end": 4, "s": 110}]   # ts 5 is left over


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="multiple of slide"):
        CountWindow(10, 3)
    with pytest.raises(ValueError, match="positive number of tuples"):
        CountWindow(0)
    with pytest.raises(ValueError, match="cannot be restored"):
        CountWindow(4, 2, {"n": "count"}).restore(CountWindow(4, 1, {"n": "count"}).snapshot())

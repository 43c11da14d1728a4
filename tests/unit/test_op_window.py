"""Window against a plain-Python reference on random, out-of-order streams."""

import math
import statistics

import pytest
from hypothesis import given, settings, strategies as st

from pescheduler.state.groups import unpack_namespaced
from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import MAX_WATERMARK, Emitter, OperatorContext
from pescheduler.operators.window import Window
from pescheduler.testing import run_operators

MAX_DELAY = 10
AGGS = {"n": ("count", "v"), "total": ("sum", "v"), "mean": ("avg", "v"), "lo": ("min", "v"),
        "hi": ("max", "v"), "var": ("var", "v"), "sd": ("stddev", "v")}
FUNCS = {"count": len, "sum": sum, "avg": statistics.fmean, "min": min, "max": max,
         "var": statistics.pvariance, "stddev": statistics.pstdev}


def reference(events, batch_size, size, slide, key="k"):
    """Rows, late events and dead tuples as the documented semantics define them."""
    wm, max_ts, kept, late, dead = MIN_WATERMARK, MIN_WATERMARK, [], [], []
    for b in range(0, len(events), batch_size):
        batch = events[b:b + batch_size]
        for t in batch:
            pane = t["ts"] - t["ts"] % slide
            if "v" not in t:
                dead.append(t)
            elif pane + size - 1 <= wm:
                late.append(t)
            elif not isinstance(t["v"], int):
                dead.append(t)
            else:
                kept.append((pane, len(kept), wm, t))     # wm at arrival: windows fired by then
        max_ts = max([max_ts] + [t["ts"] for t in batch])
        wm = max(wm, max_ts - MAX_DELAY - 1)
    ends = sorted({p + j * slide for p, *_ in kept for j in range(1, size // slide + 1)})
    rows = []
    for end in ends:
        members = sorted(m for m in kept if end - size <= m[3]["ts"] < end and m[2] < end - 1)
        groups = {}
        for *_, t in members:
            groups.setdefault(t[key] if key else None, []).append(t["v"])
        for k, values in groups.items():
            row = {key: k} if key else {}
            row.update(window_start=end - size, window_end=end)
            row.update({out: FUNCS[fn](values) for out, (fn, _) in AGGS.items()})
            rows.append(row)
    return rows, late, dead


def assert_rows_equal(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.keys() == e.keys()
        for name in e:
            assert math.isclose(a[name], e[name], rel_tol=1e-9, abs_tol=1e-6) if name in (
                "mean", "var", "sd") else a[name] == e[name], (name, a, e)


def check_against_reference(window, events, batch_size, expected, dead_in_order=True, order=list):
    """Run ``window`` over ``events``; its rows (through ``order``), late events and dead
    letters must be ``expected`` = (rows, late, dead) from a reference."""
    result = run_operators(events, window, batch_size=batch_size, max_delay=MAX_DELAY, key_field="k")
    rows, late, dead = expected
    assert_rows_equal(order(result.output), order(rows))
    assert result.sides.get("late", []) == late
    items = [d.item for d in result.dead_letters]
    if dead_in_order:
        assert items == dead
    else:       # found when taken in event-time order, not arrival order: compare as a set
        assert sorted(map(id, items)) == sorted(map(id, dead))
    return result


@st.composite
def streams(draw, poison=False):
    """Events 1 or 3 ms apart, each up to 100 ms early (late beyond MAX_DELAY), 1-5 keys."""
    base, step = draw(st.integers(-500, 500)), draw(st.sampled_from([1, 3]))
    size = draw(st.integers(0, 250))     # drawn first: hypothesis otherwise favours tiny lists
    specs = draw(st.lists(st.tuples(st.integers(0, 4), st.integers(-100, 100), st.integers(0, 100)),
                          min_size=size, max_size=size))
    events = [{"k": f"k{k}", "v": v, "ts": base + step * i - jitter}
              for i, (k, v, jitter) in enumerate(specs)]
    if poison:
        for pos, bad in draw(st.lists(st.tuples(st.integers(0, len(events)),
                                                st.sampled_from(["missing", "x", None])), max_size=5)):
            ts = events[pos - 1]["ts"] if pos else base
            events.insert(pos, {"k": "k0", "ts": ts} if bad == "missing" else {"k": "k0", "v": bad, "ts": ts})
    return events


window_shapes = st.sampled_from([(10, 10), (30, 30), (60, 60), (30, 10), (60, 20), (60, 5)])
batch_sizes = st.sampled_from([1, 7, 50, 1000])


@settings(max_examples=80, deadline=None)
@given(streams(), window_shapes, batch_sizes)
def test_matches_reference_with_late_events(events, shape, batch_size):
    size, slide = shape
    check_against_reference(Window(size, slide, AGGS), events, batch_size,
                            reference(events, batch_size, size, slide))


@settings(max_examples=40, deadline=None)
@given(streams(poison=True), window_shapes, batch_sizes)
def test_bad_tuples_are_dead_lettered_alone(events, shape, batch_size):
    size, slide = shape
    result = check_against_reference(Window(size, slide, AGGS), events, batch_size,
                                     reference(events, batch_size, size, slide))
    assert all(d.error for d in result.dead_letters)


def test_no_key_is_one_global_group():
    events = [{"k": "a", "v": 1, "ts": 0}, {"k": "b", "v": 2, "ts": 5}, {"k": "a", "v": 4, "ts": 12}]
    result = run_operators(events, Window(10, aggregates={"total": ("sum", "v")}))
    assert result.output == [{"window_start": 0, "window_end": 10, "total": 3},
                             {"window_start": 10, "window_end": 20, "total": 4}]


def test_callable_key_is_emitted_as_key_and_beats_context():
    events = [{"k": "a", "v": 1, "ts": 0}, {"k": "B", "v": 2, "ts": 5}]
    result = run_operators(events, Window("10ms", key=lambda t: t["k"].lower(),
                                          aggregates={"n": ("count", None)}), key_field="v")
    assert result.output == [{"key": "a", "window_start": 0, "window_end": 10, "n": 1},
                             {"key": "b", "window_start": 0, "window_end": 10, "n": 1}]


def test_sizes_are_durations_and_must_divide():
    assert (Window("1min", "15s").size, Window("1min", "15s").slide) == (60_000, 15_000)
    with pytest.raises(ValueError, match="multiple of slide"):
        Window("60s", "7s")
    with pytest.raises(ValueError, match="Known: approx_count_distinct, approx_percentile, avg, count"):
        Window("60s", aggregates={"x": ("median", "v")})
    with pytest.raises(ValueError, match="clash"):
        Window("60s", aggregates={"window_end": ("max", "v")})


def feed(window, batches, state):
    """Drive ``window`` as the source driver would; ``state`` = [watermark, max ts]."""
    out = Emitter()
    for batch in batches:
        window.process(batch, out)
        state[1] = max([state[1]] + [t["ts"] for t in batch])
        if state[1] - MAX_DELAY - 1 > state[0]:
            state[0] = state[1] - MAX_DELAY - 1
            window.on_watermark(state[0], out)
    return out


def check_snapshot_midstream(make, events, batch_size, cut):
    """``make()`` a window, feed part of the stream, restore its snapshot into a fresh
    ``type(w)(**w.parameters())``; both go on and give what one uninterrupted run gives."""
    full = run_operators(events, make(), batch_size=batch_size, max_delay=MAX_DELAY, key_field="k")
    batches = [events[b:b + batch_size] for b in range(0, len(events), batch_size)]
    split = int(len(batches) * cut)
    first = make()
    first.open(OperatorContext("window-1", key_field="k"))
    state = [MIN_WATERMARK, MIN_WATERMARK]
    head = feed(first, batches[:split], state)
    second = type(first)(**first.parameters())
    second.open(OperatorContext("window-1", key_field="k"))
    second.restore(first.snapshot())
    for window in (first, second):       # both go on: the snapshot must share nothing
        tail = feed(window, batches[split:], list(state))
        window.on_watermark(MAX_WATERMARK, tail)
        assert head + tail == full.output
        assert (head.sides or {}).get("late", []) + (tail.sides or {}).get("late", []) == \
            full.sides.get("late", [])


@settings(max_examples=40, deadline=None)
@given(streams(), window_shapes, st.sampled_from([1, 7, 50]), st.floats(0, 1))
def test_snapshot_restore_midstream_gives_the_same_output(events, shape, batch_size, cut):
    check_snapshot_midstream(lambda: Window(*shape, AGGS), events, batch_size, cut)


def test_restore_refuses_a_different_layout():
    state = Window(10, aggregates={"n": ("count", "v")}).snapshot()
    with pytest.raises(ValueError, match="cannot be restored"):
        Window(10, aggregates={"m": ("max", "v")}).restore(state)


def test_late_boundary_and_pane_cleanup():
    # After [0, 30] the watermark is 30 - 10 - 1 = 19: pane 10 ends at 10 + 9 <= 19, so
    # an event there is late; pane 20 still has an unfired window.
    ev = [{"k": "a", "v": 1, "ts": ts} for ts in (0, 30, 10, 20)]
    result = run_operators(ev, Window(10, aggregates={"n": ("count", "v")}), batch_size=2,
                           max_delay=MAX_DELAY, key_field="k")
    assert result.sides["late"] == [ev[2]]
    assert [(r["window_start"], r["n"]) for r in result.output] == [(0, 1), (20, 1), (30, 1)]
    window, out = Window(10, aggregates={"n": ("count", "v")}), Emitter()
    window.process(ev[:2], out)
    window.on_watermark(19, out)
    window.process(ev[3:], out)
    window.on_watermark(29, out)
    assert list(unpack_namespaced(window.snapshot()["groups"])) == [30]     # fired panes are forgotten
    assert [r["window_start"] for r in out] == [0, 20]

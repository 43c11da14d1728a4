"""Session windows against a plain-Python reference on random, out-of-order streams."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import MAX_WATERMARK, Emitter
from pescheduler.operators.session import SessionWindow
from test_op_window import AGGS, FUNCS, MAX_DELAY, check_against_reference, check_snapshot_midstream, streams


def arrivals(events, batch_size):
    """Split events into kept, late and dead as the session window sees them arrive."""
    wm, max_ts, kept, late, dead = MIN_WATERMARK, MIN_WATERMARK, [], [], []
    for b in range(0, len(events), batch_size):
        batch = events[b:b + batch_size]
        for t in batch:
            if t["ts"] <= wm:
                late.append(t)
            elif not isinstance(t.get("v"), int):
                dead.append(t)
            else:
                kept.append(t)
        max_ts = max([max_ts] + [t["ts"] for t in batch])
        wm = max(wm, max_ts - MAX_DELAY - 1)
    return kept, late, dead


def reference(events, batch_size, gap):
    """Per key, events sorted by time and cut where two are ``gap`` or more apart."""
    kept, late, dead = arrivals(events, batch_size)
    rows = []
    for k in sorted({t["k"] for t in kept}):
        mine = sorted((t for t in kept if t["k"] == k), key=lambda t: t["ts"])
        session = [mine[0]]
        for t in mine[1:] + [None]:
            if t is not None and t["ts"] - session[-1]["ts"] < gap:
                session.append(t)
                continue
            values = [s["v"] for s in session]
            row = {"k": k, "window_start": session[0]["ts"], "window_end": session[-1]["ts"] + gap}
            rows.append({**row, **{out: FUNCS[fn](values) for out, (fn, _) in AGGS.items()}})
            session = [t]
    return rows, late, dead


def in_firing_order(rows):
    return sorted(rows, key=lambda r: (r["window_end"], r["window_start"], r["k"]))


gaps = st.sampled_from([1, 5, 20, 60])
batch_sizes = st.sampled_from([1, 7, 50, 1000])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams(poison=True), gaps, batch_sizes)
def test_matches_reference_with_late_events_and_bad_tuples(backend, events, gap, batch_size):
    result = check_against_reference(SessionWindow(gap, AGGS), events, batch_size,
                                     reference(events, batch_size, gap), order=in_firing_order)
    ends = [r["window_end"] for r in result.output]
    assert ends == sorted(ends)                        # sessions fire in order of their end


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams(), gaps, st.sampled_from([1, 7, 50]), st.floats(0, 1))
def test_snapshot_restore_midstream_gives_the_same_output(backend, events, gap, batch_size, cut):
    check_snapshot_midstream(lambda: SessionWindow(gap, AGGS), events, batch_size, cut)


def test_gap_boundary_equal_timestamps_and_bridging_event():
    window, out = SessionWindow(10, {"n": "count", "s": ("sum", "v")}, key="k"), Emitter()
    window.process([{"k": "a", "v": 1, "ts": 0}, {"k": "a", "v": 2, "ts": 0},   # same ts: one session
                    {"k": "a", "v": 3, "ts": 10},                               # exactly gap: a new one
                    {"k": "a", "v": 4, "ts": 25}], out)
    assert [(s[0], s[1]) for s in window._keys.get("a")[1]] == [(0, 10), (10, 20), (25, 35)]
    window.process([{"k": "a", "v": 5, "ts": 18}], out)                         # bridges 10.. and 25..
    window.on_watermark(MAX_WATERMARK, out)
    assert out == [{"k": "a", "window_start": 0, "window_end": 10, "n": 2, "s": 3},
                   {"k": "a", "window_start": 10, "window_end": 35, "n": 3, "s": 12}]


def test_fires_when_the_watermark_reaches_the_end_and_late_goes_aside():
    window, out = SessionWindow("10ms", {"n": "count"}, key="k"), Emitter()
    window.process([{"k": "a", "ts": 0}, {"k": "b", "ts": 3}], out)
    window.on_watermark(8, out)
    assert out == []
    window.on_watermark(9, out)
    assert out == [{"k": "a", "window_start": 0, "window_end": 10, "n": 1}]
    window.process([{"k": "a", "ts": 9}, {"k": "b", "ts": 10}], out)
    assert out.sides == {"late": [{"k": "a", "ts": 9}]}
    window.on_watermark(MAX_WATERMARK, out)
    assert out[1:] == [{"k": "b", "window_start": 3, "window_end": 20, "n": 2}]
    with pytest.raises(ValueError, match="gap must be positive"):
        SessionWindow(0)
    with pytest.raises(ValueError, match="cannot be restored"):
        SessionWindow(5, {"n": "count"}).restore(window.snapshot())


# -- sessions in the keyed-state backend (pescheduler/state/) ----------------------------------

def test_sessions_live_in_the_backend_and_a_split_selects_key_groups():
    """A key's sessions are a backend record: a tuple after a snapshot marks only its group, and a
    split asks about key groups, not keys."""
    from pescheduler.operator import OperatorContext
    from pescheduler.wire import KEY_GROUPS, key_group

    window = SessionWindow(10, {"n": "count"}, key="k")
    window.open(OperatorContext("w", key_field="k"))
    window.process([{"k": f"k{i}", "ts": i % 5} for i in range(1000)], Emitter())
    snap = window.snapshot()
    window.process([{"k": "k7", "ts": 6}], Emitter())
    assert window._keys.changed() == {key_group("k7")}
    asked = []
    part = window.split_state(snap, lambda k: asked.append(k) or key_group(k) % 2 == 0)
    assert 0 < len(asked) <= KEY_GROUPS and all(g % 2 == 0 for g in part["groups"])


def test_the_disk_backend_gives_what_memory_gives_across_a_split_and_merge(tmp_path):
    import dask.config

    from pescheduler.operator import OperatorContext
    from test_op_window_copies import test_split_in_two_then_merged_back_fires_what_one_instance_fires as copies

    with dask.config.set({"pescheduler.state.backend": "disk", "pescheduler.state.dir": str(tmp_path)}):
        window = SessionWindow(4, {"n": "count"}, key="k")
        window.open(OperatorContext("w", key_field="k"))
        window.process([{"k": "a", "ts": 1}], Emitter())
        assert window._keys.backend == "disk" and window._keys.get("a")[1][0][:2] == [1, 5]
        copies("session")
        copies("shared")

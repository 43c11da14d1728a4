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


# -- a rescale's hand-over: key groups leave and come back with their sessions --------------------

def session_events(seed: int, n: int = 900, keys: int = 8) -> list[dict]:
    """Keys that come and go (a key lives for 150 events, then others take over), ``ts`` two apart:
    a key's events about 16 apart, so with a gap of 60 its session stays open while it lives and
    fires once it is gone; sessions are open at each of the hand-over's cuts."""
    import random

    rnd = random.Random(seed)
    return [{"id": f"k{rnd.randrange(keys) + i // 150 * 5}", "v": rnd.randrange(9), "ts": 2 * i} for i in range(n)]


def session_opened(state: dict | None = None) -> SessionWindow:
    """A session window (gap 60, count and sum), restored from ``state`` when given, then opened (its
    sessions then in the configured backend), as a PE makes it."""
    from keyed_handover import opened_as_a_pe

    return opened_as_a_pe(SessionWindow(60, {"n": "count", "s": ("sum", "v")}, key="id"), "session_window-1", state)


@pytest.mark.parametrize("batch", [1, 25])
def test_key_groups_moved_to_a_copy_and_back_give_every_session_once(backend, batch):
    """``export_groups``/``import_groups`` (pescheduler/worker/handover.py): the moving groups'
    sessions go to a copy (made from the export, as a new instance is) and come back to a running
    instance; the rows equal an uninterrupted run's, each session once. The timers of the groups
    that left stay in the exporting instance's heap and are dropped when due."""
    from keyed_handover import moved_to_a_copy_and_back, rows

    stream = session_events(1)
    out, whole = moved_to_a_copy_and_back(session_opened, lambda op: op._keys, stream, batch, copy_of=session_opened)
    assert session_opened()._keys.backend == backend
    assert rows(out) == rows(whole) and len(whole) > 25
    for cut in (250, 600):              # sessions open at the export and at the import moved with their groups
        assert any(r["window_start"] < stream[cut]["ts"] < r["window_end"] for r in whole)


def test_a_copy_that_imports_into_a_running_instance_fires_its_sessions():
    """A part imported into a running instance (a lazy restore's, a deferred move's gaining copy):
    the imported sessions' timers join the heap and fire at their ends, the instance's own watermark
    and key order kept."""
    from keyed_handover import resume, round_trip

    from pescheduler.state import key_group

    stream = session_events(2)
    first = session_opened()
    resume(first, stream[:300], 10, start=-1)
    moving = frozenset(g for g in first._keys.groups() if g % 2)
    part = round_trip(first.export_groups(moving))
    gaining = session_opened()
    gaining.on_watermark(stream[299]["ts"] - 1, Emitter())
    gaining.import_groups(part)
    out = resume(gaining, [e for e in stream[300:] if key_group(e["id"]) in moving], 10, start=stream[299]["ts"] - 1)
    mine = {r["id"] for r in out}
    assert mine and all(key_group(k) in moving for k in mine)
    assert first._gone == moving
    resume(first, [e for e in stream[300:] if key_group(e["id"]) not in moving], 10, start=stream[299]["ts"] - 1)
    assert not first._gone, "every timer pushed before the export came due: the set of gone groups is cleared"


def _export_s(keys: int) -> float:
    """Best of 3: the PE thread's CPU time of a rescale's export (pescheduler/worker/handover.py's
    ``export_groups``: the operator's own hook, or snapshot, split and restore of its whole state)
    of four key groups of a session window holding ``keys`` open sessions, the collector off."""
    import gc
    import time

    from pescheduler.worker.handover import export_groups

    best = float("inf")
    for _ in range(3):
        op = session_opened()
        for i in range(0, keys, 10_000):
            op.process([{"id": f"car-{j}", "v": 1, "ts": 10} for j in range(i, min(keys, i + 10_000))], Emitter())
        gc.collect()
        gc.disable()
        try:
            t = time.thread_time()
            export_groups(op, frozenset({1, 3, 5, 7}))
            best = min(best, time.thread_time() - t)
        finally:
            gc.enable()
    return best


def test_an_export_in_the_pes_turn_does_not_grow_with_the_sessions_held():
    """A Replicate's export of a session window took its whole state through snapshot, split and
    restore in the PE's turn (no ``export_groups`` of its own): 10x the keys, about 10x the time
    (issue 30: the pause must not grow with the state). Its own hook takes the moving groups out of
    the backend and leaves the heap alone."""
    small, large = _export_s(20_000), _export_s(200_000)
    assert large < 4 * small + 0.002, f"export {small * 1000:.1f} ms at 2*10^4 keys, {large * 1000:.1f} ms at 2*10^5"

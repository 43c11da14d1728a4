"""Windows sliding with every event against a plain-Python reference."""

import dask
import pytest
from hypothesis import given, settings, strategies as st

from pescheduler import Application
from pescheduler.errors import InvalidApplication
from pescheduler.operator import Emitter, OperatorContext
from pescheduler.operators.over_window import OverWindow
from test_op_window import AGGS, FUNCS, check_against_reference, check_snapshot_midstream, streams
from test_op_window_session import arrivals

@pytest.fixture(params=["memory", "disk"], scope="module")
def backend(request, tmp_path_factory):
    """The backend an opened over window keeps its keys' windows in."""
    with dask.config.set({"pescheduler.state.backend": request.param,
                          "pescheduler.state.dir": str(tmp_path_factory.mktemp("state"))}):
        yield request.param


INVERTIBLE = {out: spec for out, spec in AGGS.items() if spec[0] not in ("min", "max")}


def reference(events, batch_size, size, aggs):
    """Per event in event-time order (peers: same key and ts), the aggregates over (ts - size, ts]."""
    kept, late, dead = arrivals(events, batch_size)
    ordered = sorted(kept, key=lambda t: t["ts"])
    late_ids = {id(t) for t in late}
    taken = sorted((t for t in events if id(t) not in late_ids), key=lambda t: t["ts"])
    rows = []
    for ts in sorted({t["ts"] for t in ordered}):
        step = [t for t in ordered if t["ts"] == ts]
        # keys in the order their first tuple of the step came, bad tuples included
        for k in dict.fromkeys(t["k"] for t in taken if t["ts"] == ts):
            if not any(t["k"] == k for t in step):
                continue
            values = [t["v"] for t in ordered if t["k"] == k and ts - size < t["ts"] <= ts]
            row = {"k": k, "window_start": ts - size + 1, "window_end": ts + 1,
                   **{out: FUNCS[fn](values) for out, (fn, _) in aggs.items()}}
            rows.extend(dict(row) for t in step if t["k"] == k)
    return rows, late, dead


@settings(max_examples=60, deadline=None)
@given(streams(poison=True), st.sampled_from([1, 5, 30, 200]), st.sampled_from([1, 7, 50, 1000]),
       st.sampled_from([AGGS, INVERTIBLE]))
def test_matches_reference_with_late_events_and_bad_tuples(backend, events, size, batch_size, aggs):
    check_against_reference(OverWindow(size, aggs), events, batch_size,
                            reference(events, batch_size, size, aggs), dead_in_order=False)


@settings(max_examples=30, deadline=None)
@given(streams(), st.sampled_from([5, 30]), st.sampled_from([1, 7, 50]), st.floats(0, 1))
def test_snapshot_restore_midstream_gives_the_same_output(backend, events, size, batch_size, cut):
    check_snapshot_midstream(lambda: OverWindow(size, AGGS), events, batch_size, cut)


def test_peers_see_each_other_and_quiet_keys_are_swept(backend):
    window, out = OverWindow(10, {"n": "count", "s": ("sum", "v")}, key="k"), Emitter()
    window.open(OperatorContext("over-1"))
    assert window._keys.backend == backend
    window.process([{"k": "a", "v": 1, "ts": 0}, {"k": "a", "v": 2, "ts": 5},
                    {"k": "a", "v": 4, "ts": 5}, {"k": "b", "v": 8, "ts": 10}], out)
    window.on_watermark(10, out)
    assert [(r["k"], r["window_end"], r["n"], r["s"]) for r in out] == [
        ("a", 1, 1, 1), ("a", 6, 3, 7), ("a", 6, 3, 7), ("b", 11, 1, 8)]
    window.process([{"k": "b", "v": 1, "ts": 14}], out)
    window.on_watermark(20, out)                     # a's events are all 10 behind: swept
    assert list(window.windows()) == ["b"] and out[-1]["n"] == 2
    assert window.plan.invertible and not OverWindow(10, {"m": ("max", "v")}).plan.invertible


def test_reached_from_stream_window_with_slide_event():
    app = Application("over")
    out = app.source("iterable", items=[]).window(size="1s", slide="event", aggregates={"n": "count"})
    assert app.nodes[out.op_id].name == "over_window"
    with pytest.raises(InvalidApplication, match="exactly one of size="):
        app.source("iterable", items=[]).window(size="1s", gap="5s")


def test_a_checkpoint_of_the_per_key_form_restores_split_and_merged(backend):
    """Before the windows lived in the keyed state backend a snapshot held ``keys``: (key,
    window events, slots) triples; such a checkpoint still restores, split and merged."""
    window = OverWindow(10, {"n": "count", "s": ("sum", "v")}, key="k")
    window.open(OperatorContext("over-1"))
    window.process([{"k": "a", "v": 1, "ts": 3}, {"k": "b", "v": 2, "ts": 4}, {"k": "a", "v": 4, "ts": 9}], Emitter())
    window.on_watermark(5, Emitter())
    new = window.snapshot()
    old = {**{k: v for k, v in new.items() if k != "groups"},
           "keys": [(k, list(w), list(s)) for k, (w, s) in ((k, window._keys.get(k)) for k in ("a", "b"))]}
    parts = [window.split_state(old, lambda k, i=i: (k == "a") == i) for i in (True, False)]
    again = OverWindow(10, {"n": "count", "s": ("sum", "v")}, key="k")
    again.restore(again.merge_states(parts))
    again.open(OperatorContext("over-2"))
    assert again.windows() == window.windows()
    for w in (window, again):
        out = Emitter()
        w.on_watermark(12, out)
        assert [(r["k"], r["n"], r["s"]) for r in out] == [("a", 2, 5)]
    assert "groups" in again.snapshot()

"""Count windows against a plain-Python reference on random, out-of-order streams."""

import dask.config
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pescheduler.operator import MAX_WATERMARK, Emitter, OperatorContext
from pescheduler.wire import KEY_GROUPS, key_group
from pescheduler.operators.count_window import CountWindow
from test_op_window import AGGS, FUNCS, check_against_reference, check_snapshot_midstream, streams
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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams(poison=True), shapes, batch_sizes)
def test_matches_reference_with_late_events_and_bad_tuples(backend, events, shape, batch_size):
    check_against_reference(CountWindow(*shape, AGGS), events, batch_size,
                            reference(events, batch_size, *shape), dead_in_order=False)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams(), shapes, st.sampled_from([1, 7, 50]), st.floats(0, 1))
def test_snapshot_restore_midstream_gives_the_same_output(backend, events, shape, batch_size, cut):
    check_snapshot_midstream(lambda: CountWindow(*shape, AGGS), events, batch_size, cut)


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


# -- state in the keyed-state backend (pescheduler/state/) -------------------------------------

def test_split_asks_about_key_groups_not_keys():
    """1000 keys in at most 128 key groups: a rescale's split visits groups, not keys."""
    window = CountWindow(3, aggregates=AGGS)
    window.open(OperatorContext("w", key_field="k"))
    batch = [{"k": f"k{i}", "v": 1, "ts": i} for i in range(1000)]
    window.process(batch, Emitter())
    window.on_watermark(MAX_WATERMARK - 1, Emitter())
    asked = []
    part = window.split_state(window.snapshot(), lambda k: asked.append(k) or key_group(k) % 2 == 0)
    assert 0 < len(asked) <= KEY_GROUPS
    assert sorted(part["groups"]) == [g for g in range(KEY_GROUPS) if g % 2 == 0 and g in part["groups"]]


def test_a_key_changed_in_place_after_a_snapshot_marks_its_group_and_leaves_the_snapshot_alone():
    """The hot path changes a key's pane in place with no put: after a snapshot the first tuple of
    a key must still go through the backend (group marked changed, snapshot bytes unchanged)."""
    window, out = CountWindow(3, aggregates={"s": ("sum", "v")}, key="k"), Emitter()
    window.open(OperatorContext("w", key_field="k"))
    window.process([{"k": k, "v": 1, "ts": ts} for ts, k in enumerate("ababa", 1)], out)
    window.on_watermark(10, out)                # a: 3 tuples (a window), b: 2 (pane in place)
    snap = window.snapshot()
    assert window._keys.changed() == set()
    window.process([{"k": "b", "v": 100, "ts": 11}, {"k": "b", "v": 7, "ts": 12}], out)
    window.on_watermark(20, out)
    assert window._keys.changed() == {key_group("b")}
    assert out == [{"k": "a", "window_start": 1, "window_end": 6, "s": 3},
                   {"k": "b", "window_start": 2, "window_end": 12, "s": 102}]
    fresh, again = CountWindow(3, aggregates={"s": ("sum", "v")}, key="k"), Emitter()
    fresh.open(OperatorContext("w", key_field="k"))
    fresh.restore(snap)                         # the snapshot still holds b's two tuples, not three
    fresh.process([{"k": "b", "v": 100, "ts": 11}], again)
    fresh.on_watermark(20, again)
    assert again == [{"k": "b", "window_start": 2, "window_end": 12, "s": 102}]


def test_the_disk_backend_gives_what_memory_gives_across_a_split_and_merge(tmp_path):
    """The copies test (split in two, merged back) with the windows' keys in RocksDB."""
    from test_op_window_copies import test_split_in_two_then_merged_back_fires_what_one_instance_fires as copies

    with dask.config.set({"pescheduler.state.backend": "disk", "pescheduler.state.dir": str(tmp_path)}):
        window = CountWindow(3, aggregates=AGGS)
        window.open(OperatorContext("w", key_field="k"))
        assert window._keys.backend == "disk"
        window.close()
        copies("count")


def test_a_query_removed_compacts_the_slots_of_a_disk_backend(tmp_path):
    with dask.config.set({"pescheduler.state.backend": "disk", "pescheduler.state.dir": str(tmp_path)}):
        window = CountWindow(2, queries={"a": {"n": "count"}, "b": {"m": ("max", "v")}})
        window.open(OperatorContext("w", key_field="k"))
        assert window._keys.backend == "disk"
        window.process([{"k": "x", "v": 5, "ts": 1}], Emitter())
        window.on_watermark(2, Emitter())
        window.remove_query("a")
        window.process([{"k": "x", "v": 7, "ts": 3}], Emitter())
        out = Emitter()
        window.on_watermark(4, out)
        assert out == [("b", {"k": "x", "window_start": 1, "window_end": 4, "m": 7})]
        window.close()

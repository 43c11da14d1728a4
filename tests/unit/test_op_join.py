"""Join against a brute-force reference: every pair once, when its second event arrives."""

import pickle

import dask
import pytest
from hypothesis import given, settings, strategies as st

from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import MAX_WATERMARK, Emitter, OperatorContext
from pescheduler.operators.join import Join
from pescheduler.state import key_group


BACKENDS = pytest.mark.parametrize("backend", ["memory", "disk"])


@pytest.fixture(autouse=True, scope="module")
def state_dir(tmp_path_factory):
    """Disk stores of this module's joins go below a temporary directory."""
    with dask.config.set({"pescheduler.state.dir": str(tmp_path_factory.mktemp("state"))}):
        yield


def opened(join, backend):
    """``join`` opened with its keyed state in ``backend``."""
    join.open(OperatorContext(op_id="join-1", extra={"state": backend}))
    assert join._keys.backend == backend
    return join


def pred(left, right):
    return left["v"] <= right["v"]


event = st.fixed_dictionaries({"k": st.integers(0, 1), "ts": st.integers(0, 20), "v": st.integers(0, 3)})
step = st.one_of(st.tuples(st.sampled_from("LR"), st.lists(event, max_size=6)),
                 st.tuples(st.just("W"), st.integers(0, 4)))     # W: watermark advances by n
scenario = st.tuples(st.lists(step, max_size=25), st.integers(0, 6), st.booleans())


def numbered(steps):
    """Give every event a unique id; turn watermark increments into absolute watermarks."""
    out, n, wm = [], 0, -1
    for kind, arg in steps:
        if kind == "W":
            wm += arg
            out.append(("W", wm))
        else:
            batch = [{**e, "id": n + i} for i, e in enumerate(arg)]
            n += len(batch)
            out.append((kind, batch))
    return out + [("W", MAX_WATERMARK)]


def reference(steps, lower, upper, use_pred):
    """Per step: (sorted (left id, right id, ts) results, late ids), by the documented rules: each
    arriving event against every earlier event of the other side, ever (``lower <= r.ts - l.ts <= upper``)."""
    seen = {"L": [], "R": []}
    wm, per_step = MIN_WATERMARK, []
    for kind, arg in steps:
        if kind == "W":
            wm = max(wm, arg)
            per_step.append(([], []))
            continue
        results, late = [], []
        other = seen["R" if kind == "L" else "L"]
        for e in arg:
            if e["ts"] <= wm:
                late.append(e["id"])
                continue
            for o in other:             # everything ever buffered: purging must lose nothing
                l, r = (e, o) if kind == "L" else (o, e)
                if l["k"] == r["k"] and lower <= r["ts"] - l["ts"] <= upper and (not use_pred or pred(l, r)):
                    results.append((l["id"], r["id"], max(l["ts"], r["ts"])))
            seen[kind].append(e)
        per_step.append((sorted(results), late))
    return per_step


def run(join, steps):
    """Per step: (sorted (left id, right id | None, ts) results, late ids); any two-input join."""
    per_step = []
    for kind, arg in steps:
        emit = Emitter()
        if kind == "W":
            join.on_watermark(arg, emit)
        else:
            (join.on_left if kind == "L" else join.on_right)(arg, emit)
        per_step.append((sorted((t["left"]["id"], t["right"] and t["right"]["id"], t["ts"]) for t in emit),
                         [t["id"] for t in (emit.sides or {}).get("late", [])]))
    return per_step


@BACKENDS
@settings(max_examples=150, deadline=None)
@given(case=scenario)
def test_join_equals_brute_force_reference(backend, case):
    steps, within, use_pred = case
    steps = numbered(steps)
    join = opened(Join(within=within, on="k", predicate=pred if use_pred else None), backend)
    assert run(join, steps) == reference(steps, -within, within, use_pred)
    assert join.buffered() == {"left": {}, "right": {}} and len(join._keys) == 0   # all purged at the end


@BACKENDS
@settings(max_examples=40, deadline=None)
@given(case=scenario, cut=st.integers(0, 30), copies=st.booleans())
def test_snapshot_restore_mid_stream_equals_uninterrupted(backend, case, cut, copies):
    """Restored mid-stream (``copies``: split into two copies by key group, then merged back as a
    Replicate and a Release do), the output is the uninterrupted one's."""
    steps, within, use_pred = case
    steps = numbered(steps)
    cut = min(cut, len(steps))
    params = dict(within=within, left_key="k", right_key="k", predicate=pred if use_pred else None)
    whole = run(Join(**params), steps)
    first = opened(Join(**params), backend)
    head = run(first, steps[:cut])
    saved = pickle.loads(pickle.dumps(first.snapshot()))
    if copies:
        parts = [first.split_state(saved, lambda k, i=i: k % 2 == i) for i in (0, 1)]
        saved = pickle.loads(pickle.dumps(first.merge_states(parts)))
    second = opened(Join(**params), backend)
    second.restore(saved)
    assert head + run(second, steps[cut:]) == whole


def test_result_shape_inclusive_bounds_and_arrival_timing():
    join, out = Join(within="2s", on="car"), Emitter()
    join.on_left([{"car": "a", "ts": 1000, "id": 1}], out)
    assert out == []                                   # nothing to pair with yet
    join.on_right([{"car": "a", "ts": 3000, "id": 2},  # exactly within: inclusive
                   {"car": "a", "ts": 3001, "id": 3},  # 1 ms too far
                   {"car": "b", "ts": 1000, "id": 4}], out)  # other key
    assert out == [{"left": {"car": "a", "ts": 1000, "id": 1},
                    "right": {"car": "a", "ts": 3000, "id": 2}, "ts": 3000}]
    out.clear()
    join.on_left([{"car": "a", "ts": 3001, "id": 5}], out)     # newest event reports both its pairs
    assert [(t["left"]["id"], t["right"]["id"]) for t in out] == [(5, 2), (5, 3)]


def test_late_events_go_to_the_side_output_and_old_state_is_purged():
    join, out = Join(within=10, on="k"), Emitter()
    join.on_left([{"k": 1, "ts": 100}, {"k": 1, "ts": 105}], out)
    join.on_watermark(110, out)
    assert [e["ts"] for e in join.buffered()["left"][1]] == [105]   # 100 <= 110 - 10: gone
    join.on_right([{"k": 1, "ts": 110}, {"k": 1, "ts": 111}], out)
    assert out.sides == {"late": [{"k": 1, "ts": 110}]}
    assert [(t["left"]["ts"], t["right"]["ts"]) for t in out] == [(105, 111)]


def test_inputs_come_from_the_context_and_process_input_dispatches():
    join = Join(within=5, on="k")
    join.open(OperatorContext(op_id="join-3", extra={"inputs": ["map-1", "map-2"]}))
    assert join._inputs == ["map-1", "map-2"]
    out = Emitter()
    join.process_input(1, [{"k": 0, "ts": 1, "side": "r"}], out)
    join.process_input(0, [{"k": 0, "ts": 2, "side": "l"}], out)
    assert out[0]["left"]["side"] == "l" and out[0]["right"]["side"] == "r"
    with pytest.raises(TypeError, match="process_input"):
        join.process([{"k": 0, "ts": 3}], out)
    with pytest.raises(ValueError):
        Join(within=5, on="k", left_key="k", right_key="k")


def test_key_of_the_preceding_key_by_and_restore_guard():
    join = Join(within=5)
    join.open(OperatorContext(op_id="join-1", key_field="k"))
    assert join.input_keys() == ("k", "k")            # what a router in front of copies hashes
    out = Emitter()
    join.on_left([{"k": 0, "ts": 1}], out)
    join.on_right([{"k": 1, "ts": 1}, {"k": 0, "ts": 1}], out)
    assert len(out) == 1
    with pytest.raises(ValueError, match="within"):
        Join(within=6).restore(join.snapshot())


@BACKENDS
def test_a_checkpoint_of_the_per_key_form_restores_split_and_merged(backend):
    """Before the buffers lived in the keyed state backend a snapshot held ``left``/``right``
    dicts by key: such a checkpoint still restores (and splits and merges, for copies)."""
    old = {"within": 5, "watermark": 10, "left": {0: [{"k": 0, "ts": 12, "id": 1}]},
           "right": {1: [{"k": 1, "ts": 14, "id": 2}], 0: [{"k": 0, "ts": 13, "id": 3}]}}
    join = Join(within=5, on="k")
    parts = [join.split_state(old, lambda k, i=i: k == i) for i in (0, 1)]
    join.restore(join.merge_states(parts))
    opened(join, backend)
    assert join.buffered() == {"left": old["left"], "right": old["right"]}
    out = Emitter()
    join.on_left([{"k": 1, "ts": 15, "id": 4}], out)
    join.on_right([{"k": 0, "ts": 16, "id": 5}], out)
    assert [(t["left"]["id"], t["right"]["id"]) for t in out] == [(4, 2), (1, 5)]
    assert "groups" in join.snapshot() and "left" not in join.snapshot()


@BACKENDS
def test_keys_written_in_the_turn_before_the_export_move_with_their_groups(backend):
    """What the join wrote in the turn just before a rescale's export goes with its groups (on
    disk some of it is still in the write-back buffer when the take makes its iterator)."""
    join, out = opened(Join(within=100, on="k"), backend), Emitter()
    join.on_left([{"k": 1, "ts": 10, "id": 1}, {"k": 0, "ts": 10, "id": 0}], out)
    join.on_left([{"k": 1, "ts": 11, "id": 2}], out)
    part = pickle.loads(pickle.dumps(join.export_groups(frozenset([key_group(1)]))))
    other = opened(Join(within=100, on="k"), backend)
    other.import_groups(part)
    assert other.buffered()["left"] == {1: [{"k": 1, "ts": 10, "id": 1}, {"k": 1, "ts": 11, "id": 2}]}
    assert join.buffered()["left"] == {0: [{"k": 0, "ts": 10, "id": 0}]}

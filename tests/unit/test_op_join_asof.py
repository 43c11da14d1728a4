"""As-of join against a plain-Python ``merge_asof`` reference, on inputs out of order within the
watermark, with ties, late events, snapshots mid-stream and copies splitting the keys."""

import pickle
import random

import dask
import pytest
from hypothesis import given, settings, strategies as st
from support_ops import merge_asof
from test_op_join import numbered, run

from pescheduler.operator import MIN_WATERMARK, Emitter, OperatorContext
from pescheduler.operators.join_asof import DIRECTIONS, AsofJoin
from pescheduler.state import key_group

event = st.fixed_dictionaries({"k": st.integers(0, 2), "ts": st.integers(0, 20)})
step = st.one_of(st.tuples(st.sampled_from("LR"), st.lists(event, max_size=6)),
                 st.tuples(st.just("W"), st.integers(0, 4)))     # W: watermark advances by n
scenario = st.tuples(st.lists(step, max_size=30), st.one_of(st.none(), st.integers(0, 6)),
                     st.sampled_from(["backward", "forward", "nearest"]))


def on_time(steps):
    """``(lefts, rights, late ids)``: the events not late on arrival, in arrival order."""
    sides, late, wm = {"L": [], "R": []}, [], MIN_WATERMARK
    for kind, arg in steps:
        if kind == "W":
            wm = max(wm, arg)
            continue
        for e in arg:
            (late.append(e["id"]) if e["ts"] <= wm else sides[kind].append(e))
    return sides["L"], sides["R"], late


@settings(max_examples=400, deadline=None)
@given(scenario)
def test_join_asof_equals_merge_asof_reference(case):
    steps, tolerance, direction = case
    steps = numbered(steps)
    join = AsofJoin(by="k", tolerance=tolerance, direction=direction)
    per_step = run(join, steps)
    lefts, rights, want_late = on_time(steps)
    got = [r for results, _ in per_step for r in results]
    late = [i for _, ids in per_step for i in ids]
    assert sorted(late) == sorted(want_late)
    assert sorted(got, key=repr) == sorted(((l["id"], m, l["ts"]) for l, m in
                                            zip(lefts, merge_asof(lefts, rights, tolerance, direction).values())),
                                           key=repr)
    wm = prev = MIN_WATERMARK
    for (kind, arg), (results, _) in zip(steps, per_step):     # a result comes once the watermark is past it,
        wm = max(wm, arg) if kind == "W" else wm        # and a backward one at that very watermark
        assert all(ts <= wm for _, _, ts in results)
        if direction == "backward" and kind == "W":
            assert sorted(r[0] for r in results) == sorted(l["id"] for l in lefts if prev < l["ts"] <= wm)
        prev = wm
    assert join.snapshot()["pending"] == [[], []] and not join._waiting


def interrupted(case, cut):
    """``(steps after cut, params, uninterrupted run, join run up to cut, what it gave)``."""
    steps, tolerance, direction = case
    steps = numbered(steps)
    cut = min(cut, len(steps))
    params = dict(by="k", tolerance=tolerance, direction=direction)
    first = AsofJoin(**params)
    return steps[cut:], params, run(AsofJoin(**params), steps), first, run(first, steps[:cut])


@settings(max_examples=80, deadline=None)
@given(scenario, st.integers(0, 30))
def test_snapshot_restore_mid_stream_equals_uninterrupted(case, cut):
    rest, params, whole, first, head = interrupted(case, cut)
    second = AsofJoin(**params)
    second.restore(pickle.loads(pickle.dumps(first.snapshot())))
    assert head + run(second, rest) == whole


@settings(max_examples=80, deadline=None)
@given(scenario, st.integers(0, 30))
def test_copies_split_and_merged_mid_stream_give_the_same_results(case, cut):
    """A Replicate (split by key group) at ``cut``, then a Release (merge) at the end's watermark."""
    rest, params, whole, first, head = interrupted(case, cut)
    state = first.snapshot()
    owns = [lambda k: key_group(k) % 2 == 0, lambda k: key_group(k) % 2 == 1]
    copies = [AsofJoin(**params) for _ in owns]
    for copy, mine in zip(copies, owns):
        copy.restore(first.split_state(state, mine))
    tails = [run(copy, [(kind, [e for e in arg if mine(e["k"])] if kind != "W" else arg)
                        for kind, arg in rest[:-1]]) for copy, mine in zip(copies, owns)]
    merged = AsofJoin(**params)
    merged.restore(merged.merge_states([c.snapshot() for c in copies]))
    end = run(merged, rest[-1:])
    got = sorted(r for part in (head, *tails, end) for results, _ in part for r in results)
    assert got == sorted(r for results, _ in whole for r in results)



@settings(max_examples=80, deadline=None)
@given(scenario, st.integers(0, 30), st.sampled_from(["restored", "imported"]))
def test_key_groups_exported_to_a_copy_and_imported_back_give_the_same_results(case, cut, copy_kind):
    """A rescale's hand-over (pescheduler/worker/handover.py) on running instances: at ``cut`` the
    odd key groups leave (``export_groups``: their keys, held events and waiting lefts) for a copy
    made from the part (restored, as a new instance is) or imported into a running empty one (a
    deferred move's gaining copy); before the last step they come back (``import_groups``). The
    results equal an uninterrupted run's, and nothing is left behind in the instance they left."""
    rest, params, whole, first, head = interrupted(case, cut)
    odd = frozenset(g for g in range(128) if g % 2)
    part = pickle.loads(pickle.dumps(first.export_groups(odd)))
    assert not any(key_group(k) in odd for k in first._waiting)
    assert not any(key_group(p[1]) in odd for side in first.snapshot()["pending"] for p in side)
    copy = AsofJoin(**params)
    if copy_kind == "restored":
        copy.restore(part)
    else:
        copy.on_watermark(part["watermark"], Emitter())
        copy.import_groups(part)
    mine = lambda k: key_group(k) in odd        # noqa: E731
    tails = [run(op, [(kind, [e for e in arg if owns(e["k"])] if kind != "W" else arg) for kind, arg in rest[:-1]])
             for op, owns in ((first, lambda k: not mine(k)), (copy, mine))]
    first.import_groups(pickle.loads(pickle.dumps(copy.export_groups(odd))))
    end = run(first, rest[-1:])
    got = sorted(r for part_ in (head, *tails, end) for results, _ in part_ for r in results)
    assert got == sorted(r for results, _ in whole for r in results)
    late = sorted(i for part_ in (head, *tails, end) for _, ids in part_ for i in ids)
    assert late == sorted(i for _, ids in whole for i in ids)
    assert first.snapshot()["pending"] == [[], []] and not first._waiting


def test_result_shape_ties_and_tolerance():
    join, out = AsofJoin(by="sym", tolerance="5s"), Emitter()
    join.on_right([{"sym": "a", "ts": 1_000, "px": 1}, {"sym": "a", "ts": 3_000, "px": 2},
                   {"sym": "a", "ts": 3_000, "px": 3}], out)
    join.on_left([{"sym": "a", "ts": 3_000, "q": 9}, {"sym": "a", "ts": 9_000, "q": 8},
                  {"sym": "b", "ts": 2_000, "q": 7}], out)
    assert out == []                                   # nothing before the watermark passes
    join.on_watermark(10_000, out)
    assert sorted(((r["left"]["q"], r["right"] and r["right"]["px"], r["ts"]) for r in out)) == [
        (7, None, 2_000), (8, None, 9_000), (9, 3, 3_000)]   # last of the tie; 6 s is past tolerance


def test_forward_waits_for_the_first_right_event_after_it():
    join, out = AsofJoin(by="k", direction="forward"), Emitter()
    join.on_left([{"k": 1, "ts": 5}], out)
    join.on_watermark(100, out)
    assert out == [] and join._waiting == {1}
    join.on_right([{"k": 1, "ts": 150}, {"k": 1, "ts": 120}], out)
    join.on_watermark(130, out)
    assert [(r["left"]["ts"], r["right"]["ts"]) for r in out] == [(5, 120)]


def test_bad_arguments_inputs_and_restore_guard():
    with pytest.raises(ValueError, match="direction"):
        AsofJoin(by="k", direction="sideways")
    join = AsofJoin()
    with pytest.raises(ValueError, match="key"):
        join.open(OperatorContext(op_id="join_asof-3"))
    join.open(OperatorContext(op_id="join_asof-3", key_field="k"))
    out = Emitter()
    join.process_input(1, [{"k": 0, "ts": 1}, {"k": 0}], out)
    assert len(out.dead) == 1                         # no time: dead-lettered, the rest goes on
    with pytest.raises(TypeError, match="process_input"):
        join.process([{"k": 0, "ts": 3}], out)
    with pytest.raises(ValueError, match="tolerance"):
        AsofJoin(by="k", tolerance=5).restore(join.snapshot())


def test_the_disk_backend_gives_what_memory_gives_across_a_restore(tmp_path):
    """Keys in RocksDB (values are copies there: nothing may be changed in place), restored mid-stream."""
    rng, steps = random.Random(5), []
    for _ in range(120):
        kind = rng.choice("LRW")
        steps.append((kind, rng.randrange(6) if kind == "W" else
                      [{"k": rng.randrange(5), "ts": rng.randrange(150)} for _ in range(rng.randrange(6))]))
    steps = numbered(steps)
    for direction in DIRECTIONS:
        params = dict(by="k", tolerance=9, direction=direction)
        memory = run(AsofJoin(**params), steps)
        assert sum(len(results) for results, _ in memory) > 50
        with dask.config.set({"pescheduler.state.backend": "disk", "pescheduler.state.dir": str(tmp_path)}):
            first, second = AsofJoin(**params), AsofJoin(**params)
            for op in (first, second):
                op.open(OperatorContext(op_id="join_asof-3"))
            assert first._keys.backend == "disk"
            head = run(first, steps[:60])
            second.restore(pickle.loads(pickle.dumps(first.snapshot())))
            assert head + run(second, steps[60:]) == memory


@pytest.mark.parametrize("direction", ["forward", "nearest"])
def test_a_window_after_a_forward_join_counts_every_result_on_time(direction):
    """The join's output watermark waits for the lefts still waiting for a right event (issue 33):
    had it gone on with the inputs', the window would have fired their windows already and sent
    their results to ``late``."""
    from pescheduler import Application
    from pescheduler.testing import run_graph

    lefts = [{"k": 0, "ts": t, "id": t} for t in range(100)]
    rights = [{"k": 0, "ts": t, "q": t} for t in range(15, 130, 15)]
    app = Application("held")
    left = app.source("iterable", items=lefts, max_delay=0)
    right = app.source("iterable", items=rights, max_delay=0)
    joined = (left.join_asof(right, by="k", direction=direction)
              .map(lambda r: {"k": r["left"]["k"], "ts": r["ts"], "q": r["right"] and r["right"]["q"]}))
    counts = joined.key_by("k").window(size=10, aggregates={"n": ("count", None)})
    result = run_graph(counts, batch_size=4)
    assert "late" not in result.sides, f"{len(result.sides['late'])} joined rows were late"
    assert sorted((r["window_start"], r["n"]) for r in result.output) == [(s, 10) for s in range(0, 100, 10)]

"""Interval join (``lower``/``upper`` bounds of ``r.ts - l.ts``) against test_op_join's nested-loop reference:
every pair once, when its second event arrives; ``within=w`` is the case ``lower=-w, upper=w``."""

import pickle

import pytest
from hypothesis import given, settings, strategies as st
from test_op_join import BACKENDS, numbered, opened, pred, reference, run, state_dir, step  # noqa: F401

from pescheduler import Application
from pescheduler.operator import Emitter
from pescheduler.operators.join import Join
from pescheduler.timeutil import parse_offset

bounds = st.tuples(st.integers(-8, 8), st.integers(0, 8)).map(lambda lw: (lw[0], lw[0] + lw[1]))
scenario = st.tuples(st.lists(step, max_size=25), bounds, st.booleans())


@BACKENDS
@settings(max_examples=200, deadline=None)
@given(case=scenario)
def test_interval_join_equals_nested_loop_reference(backend, case):
    steps, (lower, upper), use_pred = case
    steps = numbered(steps)
    join = opened(Join(lower=lower, upper=upper, on="k", predicate=pred if use_pred else None), backend)
    assert run(join, steps) == reference(steps, lower, upper, use_pred)
    assert join.buffered() == {"left": {}, "right": {}}   # all purged at the end


@BACKENDS
@settings(max_examples=40, deadline=None)
@given(case=scenario, cut=st.integers(0, 30))
def test_snapshot_restore_mid_stream_equals_uninterrupted(backend, case, cut):
    steps, (lower, upper), _ = case
    steps = numbered(steps)
    cut = min(cut, len(steps))
    whole = run(Join(lower=lower, upper=upper, on="k"), steps)
    first = opened(Join(lower=lower, upper=upper, on="k"), backend)
    head = run(first, steps[:cut])
    second = opened(Join(lower=lower, upper=upper, on="k"), backend)
    second.restore(pickle.loads(pickle.dumps(first.snapshot())))
    assert head + run(second, steps[cut:]) == whole


def test_one_sided_bounds_and_the_stream_method():
    join, out = Join(lower="-5s", upper="0s", on="sym"), Emitter()   # r at most 5 s before l
    join.on_right([{"sym": "a", "ts": 1_000, "id": "r1"}, {"sym": "a", "ts": 6_000, "id": "r2"}], out)
    join.on_left([{"sym": "a", "ts": 5_000, "id": "l1"}], out)
    join.on_right([{"sym": "a", "ts": 5_000, "id": "r3"}], out)        # equal times qualify
    assert [(t["left"]["id"], t["right"]["id"]) for t in out] == [("l1", "r1"), ("l1", "r3")]
    app = Application("interval")
    a, b = app.source("iterable", items=[]), app.source("iterable", items=[])
    joined = a.join_interval(b, by="sym", lower="-5s", upper="0s")
    node = app.nodes[joined.op_id]
    assert (node.name, node.key_field, node.params) == ("join", "sym", {"lower": "-5s", "upper": "0s", "on": "sym"})


def test_bounds_are_checked_and_restore_names_them():
    with pytest.raises(ValueError, match="within= .* or both lower= and upper="):
        Join(within="1s", lower="-1s", upper="0s")
    with pytest.raises(ValueError, match="after upper"):
        Join(lower="1s", upper="-1s")
    assert parse_offset("-1.5s") == -1_500 and parse_offset(7) == 7
    with pytest.raises(ValueError, match="bounds"):
        Join(lower=-5, upper=5).restore(Join(lower=-5, upper=0).snapshot())
    Join(within=5).restore(Join(lower=-5, upper=5).snapshot())      # the same join
    Join(within=5).restore({**Join(within=5).snapshot(), "within": 5})   # a snapshot written before bounds

"""count_distinct, percentile, first/last, top_k (exact) and their sketches: against exact
references, merges of random splits equal the whole, snapshots pickle, errors name the fix."""

import pickle
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pescheduler.aggregates import AggregatePlan
from pescheduler.collection_aggregates import (HLL_RELATIVE_ERROR, KLL_RANK_ERROR, DistinctSketch,
                                               QuantileSketch)
from pescheduler.operators.window import Window
from pescheduler.testing import run_operators

EXACT = {"d": ("count_distinct", "v"), "p50": ("percentile", "v", 0.5), "p90": ("percentile", "v", 0.9),
         "first": ("first", "v"), "last": ("last", "v"), "top": ("top_k", "v", 3)}


def reference(events: list) -> dict:
    """The exact aggregates of ``(ts, v)`` events in arrival order, computed plainly."""
    values = [v for _, v in events]
    counts = Counter(values)
    return {"d": len(set(values)), "p50": np.percentile(values, 50), "p90": np.percentile(values, 90),
            "first": min(events, key=lambda e: e[0])[1],              # min/max keep the first of a tie
            "last": max(reversed(events), key=lambda e: e[0])[1],
            "top": sorted(counts.items(), key=lambda vc: (-vc[1], vc[0]))[:3]}


def fold(plan: AggregatePlan, events: list) -> list:
    """One group's slots after folding ``events`` (one pane)."""
    panes: dict = {}
    failed = plan.pane_updater(None, "ts", 10**9)(iter({"ts": ts, "v": v} for ts, v in events),
                                                   panes, -1, None)
    assert failed is None
    return panes[0][None]


def row(plan: AggregatePlan, slots: list) -> dict:
    out: list = []
    plan.row_writer(plan.queries[0], None)([(None, slots)], 0, 1, out.append)
    return {k: v for k, v in out[0].items() if k not in ("window_start", "window_end")}


events_strategy = st.lists(st.tuples(st.integers(0, 20), st.integers(-50, 50)), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(events=events_strategy, cuts=st.lists(st.integers(0, 60), max_size=3))
def test_merges_of_random_splits_equal_the_whole_and_the_exact_reference(events, cuts):
    plan = AggregatePlan(EXACT)
    whole = row(plan, fold(plan, events))
    assert whole == pytest.approx(reference(events))
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(events)), len(events)]
    parts = [fold(plan, events[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
    before = [row(plan, part) for part in parts]
    merge, merged = plan.merger(), parts[0]
    for part in parts[1:]:
        merged = merge(merged, part)
    assert row(plan, merged) == whole
    assert [row(plan, part) for part in parts] == before    # a merge changes neither side (sliding panes)


@settings(max_examples=50, deadline=None)
@given(events=events_strategy)
def test_a_snapshot_pickles_and_the_restored_state_goes_on_alike(events):
    plan = AggregatePlan({**EXACT, "a": ("approx_count_distinct", "v"), "q": ("approx_percentile", "v", 0.5)})
    half = len(events) // 2
    slots = fold(plan, events[:half] or events[:1])
    restored = pickle.loads(pickle.dumps(slots))
    rest = fold(plan, events[half:] or events[:1])
    merge = plan.merger()
    assert row(plan, merge(restored, rest)) == row(plan, merge(slots, rest))


def test_sketches_snapshot_as_their_serialized_bytes():
    for sketch in (DistinctSketch().add(1), QuantileSketch().add(1.5)):
        rebuild, (data,) = sketch.__reduce__()
        assert type(data) is bytes and type(rebuild(data)) is type(sketch)


def test_approx_count_distinct_is_within_three_standard_errors_on_a_million_values():
    plan = AggregatePlan({"a": ("approx_count_distinct", "v")})
    n = 10**6
    left = fold(plan, [(0, i) for i in range(0, n, 2)])                 # two copies' partials
    right = fold(plan, [(0, i) for i in range(1, n, 2)] + [(0, 7)] * 1000)   # repeats count once
    estimate = row(plan, plan.merger()(left, right))["a"]
    assert abs(estimate - n) <= 3 * HLL_RELATIVE_ERROR * n, estimate


def test_approx_percentile_rank_is_within_the_kll_bound_on_a_million_values():
    rnd = random.Random(7)
    values = [rnd.lognormvariate(3, 1) for _ in range(10**6)]        # a latency-like tail
    plan = AggregatePlan({f"q{q}": ("approx_percentile", "v", q) for q in (0.01, 0.5, 0.99)})
    merged = plan.merger()(fold(plan, [(0, v) for v in values[:300_000]]),
                           fold(plan, [(0, v) for v in values[300_000:]]))
    ordered = np.sort(values)
    for q in (0.01, 0.5, 0.99):
        estimate = row(plan, merged)[f"q{q}"]
        rank = np.searchsorted(ordered, estimate, side="right") / len(values)
        assert abs(rank - q) <= KLL_RANK_ERROR, (q, estimate, rank)


def test_same_parameter_shares_one_accumulator_and_another_gets_its_own():
    plan = AggregatePlan({"a": ("percentile", "v", 0.5), "b": ("percentile", "v", 0.5)})
    plan.add({"c": ("percentile", "v", 0.9), "d": ("top_k", "v", 2), "e": ("count_distinct", "v")})
    assert plan.layout == ("percentile(0.5)(v)", "percentile(0.9)(v)", "top_k(2)(v)", "count_distinct(v)")


@pytest.mark.parametrize("spec, message", [
    (("percentile", "v"), r"'percentile' needs a parameter: \(function, field, q"),
    (("percentile", "v", 1.5), r"'p': percentile: q must be a number in \[0, 1\]"),
    (("approx_percentile", "v", "high"), r"q must be a number in \[0, 1\]"),
    (("top_k", "v", 0), r"top_k: k must be a positive int"),
])
def test_a_missing_or_bad_parameter_names_the_fix(spec, message):
    with pytest.raises(ValueError, match=message):
        AggregatePlan({"p": spec})


def test_first_and_last_follow_event_time_not_arrival_in_windows_and_sessions():
    events = [{"k": 1, "ts": 5, "v": "b"}, {"k": 1, "ts": 2, "v": "a"}, {"k": 1, "ts": 9, "v": "c"},
              {"k": 1, "ts": 7, "v": "x"}]
    aggs = {"first": ("first", "v"), "last": ("last", "v"), "n": ("count_distinct", "v")}
    out = run_operators(events, Window(100, aggregates=aggs, key="k")).output
    assert [(r["first"], r["last"], r["n"]) for r in out] == [("a", "c", 4)]
    from pescheduler.operators.session import SessionWindow

    out = run_operators(events, SessionWindow(gap=50, aggregates=aggs, key="k")).output
    assert [(r["first"], r["last"], r["n"]) for r in out] == [("a", "c", 4)]


def test_an_unhashable_value_is_a_dead_letter_and_the_stream_goes_on():
    events = [{"ts": 1, "v": 1}, {"ts": 2, "v": [1]}, {"ts": 3, "v": 2}]
    result = run_operators(events, Window(10, aggregates={"d": ("count_distinct", "v")}))
    assert [r["d"] for r in result.output] == [2]
    assert len(result.dead_letters) == 1

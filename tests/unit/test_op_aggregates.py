"""The aggregate plan: sharing, generated code, plug-in aggregates, errors."""

import math
import operator

import pytest

from pescheduler.aggregates import BUILTINS, Aggregate, AggregatePlan
from pescheduler.operators import pescheduler_aggregates
from pescheduler.operators.window import Window
from pescheduler.testing import run_operators


def fold(plan, tuples, key="k", ts="ts", slide=1000):
    """Run the generated updater over ``tuples``; return panes and what it reported."""
    panes, late, failures = {}, [], []
    items = iter(tuples)
    failed = plan.pane_updater(key, ts, slide)(items, panes, -10**9, late.append)
    while failed is not None:
        failures.append(failed)
        failed = plan.pane_updater(key, ts, slide)(items, panes, -10**9, late.append)
    return panes, late, failures


def test_queries_share_accumulators_and_count_is_counted_once():
    plan = AggregatePlan()
    plan.add({"avg_speed": ("avg", "speed"), "n": ("count", "car")})
    plan.add({"sd": ("stddev", "speed"), "v": ("var", "speed"), "m": ("avg", "speed"),
              "trips": "count"})
    assert plan.layout == ("sum(speed)", "count(None)", "sumsq(speed)")
    assert plan.fields == ["speed"]


def test_generated_functions_compute_every_builtin():
    plan = AggregatePlan()
    query = plan.add({name: (name, "v") for name in ("count", "sum", "avg", "min", "max", "var", "stddev")})
    values = [3, 1, 4, 1, 5]
    panes, _, _ = fold(plan, [{"k": "a", "v": v, "ts": i} for i, v in enumerate(values)])
    rows = []
    plan.row_writer(query, "k")(panes[0].items(), 0, 1000, rows.append)
    var = sum((v - 2.8) ** 2 for v in values) / 5
    assert rows[0] == pytest.approx({"k": "a", "window_start": 0, "window_end": 1000, "count": 5,
                                     "sum": 14, "avg": 2.8, "min": 1, "max": 5, "var": var,
                                     "stddev": math.sqrt(var)})


def test_merge_of_two_partials_equals_one_fold():
    plan = AggregatePlan({"s": ("stddev", "v"), "lo": ("min", "v"), "hi": ("max", "v")})
    data = [{"k": 1, "v": v, "ts": 0} for v in (7, -2, 9, 4, 4, 0)]
    whole, left, right = (fold(plan, part)[0][0][1] for part in (data, data[:2], data[2:]))
    assert left == [5, 53, 2, -2, 7]        # sum, sumsq, count, min, max
    assert plan.merger()(left, right) == whole
    assert left == [5, 53, 2, -2, 7]        # merge built a new list: a pane feeds many windows


def test_bad_tuple_changes_nothing_and_is_reported():
    plan = AggregatePlan({"total": ("sum", "v"), "lo": ("min", "v")})
    good, bad_type, no_field = {"k": 1, "v": 2, "ts": 0}, {"k": 1, "v": "x", "ts": 0}, {"k": 1, "ts": 0}
    panes, _, failures = fold(plan, [good, bad_type, no_field, good])
    assert panes[0][1] == [4, 2]
    assert [(t, type(e)) for t, e in failures] == [(bad_type, TypeError), (no_field, KeyError)]


def test_plugin_aggregate_without_templates_and_derived_from_builtins():
    sumlog = Aggregate("sumlog", create=lambda: 0.0, update=lambda a, v: a + math.log(v),
                       merge=operator.add)
    geomean = Aggregate("geomean", uses=("sumlog", "count"), result=lambda s, n: math.exp(s / n))
    spread = Aggregate("spread", uses=("max", "min"), result=operator.sub)
    plan = AggregatePlan(registry={a.name: a for a in (sumlog, geomean, spread)})
    query = plan.add({"g": ("geomean", "v"), "r": ("spread", "v")})
    panes, _, _ = fold(plan, [{"k": 0, "v": v, "ts": 0} for v in (1, 4, 16)])
    rows = []
    plan.row_writer(query, None)(panes[0].items(), 0, 1000, rows.append)
    assert rows == [{"window_start": 0, "window_end": 1000, "g": pytest.approx(4.0), "r": 15}]


def test_registry_comes_before_builtins():
    doubled = Aggregate("sum", create=lambda: 0, update=lambda a, v: a + 2 * v, merge=operator.add)
    plan = AggregatePlan({"s": ("sum", "v")}, registry={"sum": doubled})
    assert fold(plan, [{"k": 0, "v": 5, "ts": 0}])[0][0][0] == [10]


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="unknown aggregate function 'median'. Known: approx_count_distinct, approx_percentile, avg, count"):
        AggregatePlan({"m": ("median", "v")})
    with pytest.raises(ValueError, match="expected \\(function, field\\)"):
        AggregatePlan({"m": 42})
    loop = {"a": Aggregate("a", uses=("b",), result=abs), "b": Aggregate("b", uses=("a",), result=abs)}
    with pytest.raises(ValueError, match="cycle: a -> b -> a"):
        AggregatePlan({"x": ("a", "v")}, registry=loop)
    with pytest.raises(ValueError, match="needs create, update and merge"):
        Aggregate("half", create=lambda: 0)


def test_builtin_plugin_registers_the_aggregates_windows_use():
    assert {a.name for a in pescheduler_aggregates()} == set(BUILTINS) == {
        "count", "sum", "sumsq", "min", "max", "avg", "var", "stddev",
        "count_distinct", "approx_count_distinct", "first", "last"}
    out = run_operators([{"v": 2, "ts": 0}, {"v": 6, "ts": 1}],
                        Window(10, aggregates={"sd": ("stddev", "v")})).output
    assert out == [{"window_start": 0, "window_end": 10, "sd": 2.0}]


def test_an_aggregate_object_can_be_handed_to_a_window():
    sumlog = Aggregate("sumlog", create=lambda: 0.0, update=lambda a, v: a + math.log(v),
                       merge=operator.add)
    geomean = Aggregate("geomean", uses=(sumlog, "count"), result=lambda s, n: math.exp(s / n))
    out = run_operators([{"v": 2, "ts": 0}, {"v": 8, "ts": 1}],
                        Window(10, aggregates={"g": (geomean, "v")})).output
    assert out == [{"window_start": 0, "window_end": 10, "g": pytest.approx(4.0)}]
    with pytest.raises(ValueError, match="two different aggregates are named 'sumlog'"):
        AggregatePlan({"a": (sumlog, "v"), "b": (Aggregate("sumlog", uses=("sum",), result=abs), "v")})


def test_module_examples_run():
    import doctest

    import pescheduler.aggregates

    result = doctest.testmod(pescheduler.aggregates)
    assert result.attempted >= 5 and result.failed == 0

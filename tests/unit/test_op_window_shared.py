"""Sharing aggregates across queries on one window (the Oracle data-stream method).

K named queries on one window operator compute each distinct base aggregate once
(counted with plug-in aggregates that count their updates), give the rows K
independent windows give, and queries added or removed mid-stream leave the
others exact.
"""

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from pescheduler.aggregates import BUILTINS, Aggregate
from pescheduler.operator import MIN_WATERMARK
from pescheduler.operator import MAX_WATERMARK, OperatorContext
from pescheduler.operators.count_window import CountWindow
from pescheduler.operators.over_window import OverWindow
from pescheduler.operators.session import SessionWindow
from pescheduler.operators.window import Window
from pescheduler.testing import run_operators
from test_op_window import MAX_DELAY, assert_rows_equal, feed, streams

UPDATES: Counter = Counter()
_COUNTING: dict = {}


def counting(name):
    """The built-in ``name`` as a plug-in without templates whose updates are counted."""
    if name not in _COUNTING:
        b = BUILTINS[name]
        if b.is_base:
            def update(a, v, _name=name, _update=b.update):
                UPDATES[_name] += 1
                return _update(a, v)
            _COUNTING[name] = Aggregate(f"counted_{name}", create=b.create, update=update,
                                        merge=b.merge, needs_field=b.needs_field,
                                        subtract=b.subtract)
        else:
            _COUNTING[name] = Aggregate(f"counted_{name}", uses=tuple(counting(u) for u in b.uses),
                                        result=b.result)
    return _COUNTING[name]


def q(**outputs):
    """A query with counting aggregates: ``q(m=("avg", "v"))``."""
    return {out: (counting(fn), fld) for out, (fn, fld) in outputs.items()}


def plain(query):
    return {out: (agg.name.removeprefix("counted_"), fld) for out, (agg, fld) in query.items()}


QUERIES = {"mean": q(m=("avg", "v")), "spread": q(var=("var", "v"), sd=("stddev", "v")),
           "all": q(m=("avg", "v"), sd=("stddev", "v"), n=("count", None), s=("sum", "v")),
           "n": q(n=("count", "v")), "mean2": q(m=("avg", "v"))}
KINDS = {"sliding": lambda **kw: Window(30, 10, **kw), "tumbling": lambda **kw: Window(20, **kw),
         "session": lambda **kw: SessionWindow(8, **kw), "count": lambda **kw: CountWindow(6, 2, **kw)}
# A window sliding with every event keeps one running group per key, so a query added
# mid-stream reports a key only once its window has emptied: not in the mid-stream test.
ALL_KINDS = {**KINDS, "over": lambda **kw: OverWindow(15, **kw)}


def rows_of(output, qid):
    return [row for q_id, row in output if q_id == qid]


@pytest.mark.parametrize("kind", ALL_KINDS)
@settings(max_examples=15, deadline=None)
@given(events=streams())
def test_k_queries_update_each_base_aggregate_once_and_equal_independent_ones(kind, events):
    UPDATES.clear()
    shared = run_operators(events, ALL_KINDS[kind](queries=QUERIES), batch_size=20,
                           max_delay=MAX_DELAY, key_field="k")
    late = len(shared.sides.get("late", []))
    folded = len(events) - late
    assert UPDATES == ({"sum": folded, "sumsq": folded, "count": folded} if folded else {})
    for qid, query in QUERIES.items():
        alone = run_operators(events, ALL_KINDS[kind](aggregates=plain(query)), batch_size=20,
                              max_delay=MAX_DELAY, key_field="k")
        assert_rows_equal(rows_of(shared.output, qid), alone.output)


def drive(window, head, tail, change):
    """Feed ``head``, apply ``change(window)``, feed ``tail`` to the end; return all output."""
    window.open(OperatorContext("w", key_field="k"))
    state = [MIN_WATERMARK, MIN_WATERMARK]
    out = feed(window, head, state)
    change(window)
    rest = feed(window, tail, state)
    window.on_watermark(MAX_WATERMARK, rest)
    return list(out), list(rest)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=15, deadline=None)
@given(events=streams(), cut=st.floats(0, 1))
def test_queries_added_and_removed_midstream_keep_the_others_exact(kind, events, cut):
    batches = [events[b:b + 7] for b in range(0, len(events), 7)]
    split = int(len(batches) * cut)
    head, tail = batches[:split], batches[split:]
    first = {"keep": q(sd=("stddev", "v"), n=("count", None)), "gone": q(hi=("max", "v"), m=("avg", "v"))}
    added = q(lo=("min", "v"), m=("avg", "v"))

    def change(window):
        window.remove_query("gone")                 # max(v) is freed, sum and count stay in use
        assert "counted_max(v)" not in window.plan.layout
        assert "counted_sum(v)" in window.plan.layout
        window.add_query("added", added)            # min(v) is new, avg shares sum and count

    UPDATES.clear()
    before, after = drive(KINDS[kind](queries=first), head, tail, change)
    alone = {qid: run_operators(events, KINDS[kind](aggregates=plain(query)), batch_size=7,
                                max_delay=MAX_DELAY, key_field="k").output
             for qid, query in {**first, "added": added}.items()}
    assert_rows_equal(rows_of(before + after, "keep"), alone["keep"])
    assert_rows_equal(rows_of(before, "gone"), alone["gone"][:len(rows_of(before, "gone"))])
    assert rows_of(after, "gone") == []
    # The added query reports only (key, window)s it saw whole: a subsequence of the
    # independent rows that holds every window starting after the head's last event.
    got, expected = rows_of(after, "added"), alone["added"]
    it = iter(expected)
    assert all(any(row == e for e in it) for row in got)
    head_ts = max((t["ts"] for b in head for t in b), default=MIN_WATERMARK)
    assert [r for r in expected if r["window_start"] > head_ts] == \
        [r for r in got if r["window_start"] > head_ts]
    assert UPDATES["max"] <= sum(map(len, head))      # no update of a released aggregate


def test_named_queries_are_validated_and_parameters_follow_the_plan():
    window = Window(10, queries={"a": {"n": "count"}})
    with pytest.raises(ValueError, match="exists already"):
        window.add_query("a", {"n": "count"})
    with pytest.raises(ValueError, match="unknown aggregate function 'median'"):
        window.add_query("b", {"m": ("median", "v")})
    assert window.plan.layout == ("count(None)",) and window.query_ids == ["a"]
    window.add_query("b", {"s": ("sum", "v")})
    assert window.parameters()["queries"] == {"a": {"n": "count"}, "b": {"s": ("sum", "v")}}
    window.remove_query("a")
    assert window.plan.layout == ("sum(v)",)
    with pytest.raises(KeyError, match="no query 'a'"):
        window.remove_query("a")
    with pytest.raises(ValueError, match="not both"):
        Window(10, aggregates={"n": "count"}, queries={})
    with pytest.raises(ValueError, match="needs a window made with queries="):
        Window(10, aggregates={"n": "count"}).add_query("x", {})

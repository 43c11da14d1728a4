"""EP lambda predicates as expressions (pescheduler/ep/lifted.py): where the schemas make a lambda and
its ``col`` tree agree, the query gets the expression (a hash probe for an equation, SQL on the database
providers) and answers exactly what calling the lambda answers."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pescheduler import ep
from pescheduler.expr import Expr

SCHEMA = {"a": int, "b": int, "x": float, "s": str, "f": bool}
CORRELATIONS = [
    lambda l, r: l["a"] - r["b"] == 2,
    lambda l, r: l["a"] == r["a"] and l["x"] > r["x"],
    lambda l, r: l["s"] == r["s"] or not r["f"],
    lambda l, r: abs(l["x"] - r["x"]) / 2 < 1.5,
    lambda l, r: l["a"] % 3 == r["b"] % 3,
]
FILTERS = [lambda e: e["a"] * 2 > e["x"], lambda e: -e["b"] <= e["a"] < 3 and e["f"], lambda e: e["s"] != "y"]
EVENT = st.fixed_dictionaries({"a": st.integers(-3, 6), "b": st.integers(-3, 6),
                               "x": st.floats(-5, 5, allow_nan=False).map(lambda v: round(v, 1)),
                               "s": st.sampled_from("xyz"), "f": st.booleans()})
PUSHES = st.lists(st.tuples(st.sampled_from("st"), EVENT), max_size=25)


def answers(provider: str, query: ep.Definition, pushes: list) -> tuple[list, object]:
    """What ``query`` gives on ``provider`` for ``pushes`` (one per ms), and the predicate it ran."""
    proc = ep.EventProcessor(provider)
    try:
        for name in "st":
            proc.register_stream(name, SCHEMA)
        got: list = []
        proc.create_query("q", query)
        proc.add_output_processor("q", got.append)
        for ts, (stream, event) in enumerate(pushes):
            proc.push_event(stream, event, ts)
        return got, proc._queries["q"].terminal or proc._queries["q"].filters[0]
    finally:
        proc.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CORRELATIONS), PUSHES)
def test_a_lifted_correlation_answers_what_calling_the_lambda_answers(predicate, pushes):
    def query(p):
        return ep.Stream("s", window=ep.Tumbling("10ms")).correlate("t", p)
    want, called = answers("native", query(functools.partial(predicate)), pushes)    # not a lambda: called
    got, ran = answers("native", query(predicate), pushes)
    assert not isinstance(called.predicate, Expr) and isinstance(ran.predicate, Expr)
    assert got == want
    assert answers("sqlite", query(predicate), pushes)[0] == want


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FILTERS), PUSHES)
def test_a_lifted_filter_answers_what_calling_the_lambda_answers(predicate, pushes):
    want, _ = answers("native", ep.Stream("s").filter(functools.partial(predicate)), pushes)
    got, ran = answers("native", ep.Stream("s").filter(predicate), pushes)
    assert isinstance(ran.predicate, Expr) and got == want
    assert answers("sqlite", ep.Stream("s").filter(predicate), pushes)[0] == want


def _in_filter(names):
    return lambda e: e["s"] in names and e["a"] not in (0, 4)       # ``names``: a tuple bound once, here


IN_PREDICATES = [lambda e: e["a"] in (1, 2, 5), lambda e: e["s"] not in ["x", "q"],
                 lambda e: e["x"] in (0.5, 1, -2.0) or e["b"] in (3, 4.0), _in_filter(("x", "z"))]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(IN_PREDICATES), PUSHES)
def test_in_a_tuple_of_literals_is_lifted_and_answers_what_calling_the_lambda_answers(predicate, pushes):
    want = everything(ep.Stream("s").filter(_called(predicate)), pushes)
    got = everything(ep.Stream("s").filter(predicate), pushes)
    assert isinstance(got[2].filters[0].predicate, Expr)
    assert got[:2] == want[:2]                  # results and dead letters
    assert answers("sqlite", ep.Stream("s").filter(predicate), pushes)[0] == want[0]
    window = ep.Stream("s", window=ep.Tumbling("10ms"))
    pair = lambda l, r: l["a"] - r["b"] == 1 and r["s"] in ("y", "z")         # noqa: E731
    want = everything(window.correlate("t", _called(pair)), pushes)
    got = everything(window.correlate("t", pair), pushes)
    assert isinstance(got[2].terminal.predicate, Expr) and got[:2] == want[:2]


def test_an_equation_in_a_lambda_becomes_the_shared_hash_probe():
    proc = ep.EventProcessor("native")
    for name in "st":
        proc.register_stream(name, SCHEMA)
    proc.create_query("q", ep.Stream("s", window=ep.Tumbling("1s")).correlate("t", lambda l, r: l["a"] - r["b"] == 2))
    assert any(op_id.startswith("ep_correlate") for op_id in proc._nodes)       # not a join testing every pair
    proc.close()


def test_what_the_schema_cannot_make_exact_stays_a_lambda():
    proc = ep.EventProcessor("sqlite")
    for name in "st":
        proc.register_stream(name, SCHEMA)
    for predicate in (lambda e: e["a"] / e["b"] > 1,          # a zero divisor raises in Python
                      lambda e: e["x"] % 2 > 1,                # % of floats
                      lambda e: e["a"] and e["f"],             # and of an int gives an operand
                      lambda e: e["s"] < 1):                   # str < int raises in Python
        with pytest.raises(TypeError, match="write it as an expression"):
            proc.create_query("q", ep.Stream("s").filter(predicate))
    proc.close()


# -- lambdas reading the query's own constants (closure cells) and patterns (issue 34) ------------

def _correlation(k):
    return lambda l, r: l["a"] - r["b"] == k + 1


def _filter(k, name):
    return lambda e: e["a"] - e["b"] == k or e["s"] == name


def _pattern(k, spec):
    """JEPC's pattern query with lambdas, reading ``k`` from here; ``spec`` one of PATTERNS."""
    return ep.Pattern(spec, {"x": lambda e, m: e["f"], "y": lambda e, m: e["a"] - m["z1"] == k,
                             "u": lambda e, m: e["a"] - m["z2"] <= k * 2},
                      do={"x": lambda e, m: {"z1": e["a"]}, "y": lambda e, m: {"z2": e["a"] + m["z1"]}})


PATTERNS = ["x y u", "x  y u", "x y+ u", "x y (u | y)", "x y u?"]   # lifted: the first two (lift_pattern)


def _called(step):
    """``step`` with every function a functools.partial of it: called as Python, never lifted."""
    if isinstance(step, ep.Pattern):
        return ep.Pattern(step.pattern, {s: functools.partial(f) for s, f in step.define.items()},
                          do={s: functools.partial(f) for s, f in step.do.items()})
    return functools.partial(step)


def everything(query: ep.Definition, pushes: list) -> tuple[list, list, object]:
    """Results, dead letters (item, error type) and the definition the native engine ran."""
    proc = ep.EventProcessor("native")
    try:
        for name in "st":
            proc.register_stream(name, SCHEMA)
        got: list = []
        proc.create_query("q", query)
        proc.add_output_processor("q", got.append)
        for ts, (stream, event) in enumerate(pushes):
            proc.push_event(stream, event, ts)
        proc.close()
        dead = [(d.item, d.error.splitlines()[-1].split(":")[0]) for d in proc.dead_letters()]
        return got, dead, proc._queries["q"]
    finally:
        proc.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(-3, 4), PUSHES)
def test_a_lambda_reading_its_querys_constant_is_lifted_and_answers_the_same(k, pushes):
    window = ep.Stream("s", window=ep.Tumbling("10ms"))
    want = everything(window.correlate("t", _called(_correlation(k))), pushes)
    got = everything(window.correlate("t", _correlation(k)), pushes)
    assert isinstance(got[2].terminal.predicate, Expr) and not isinstance(want[2].terminal.predicate, Expr)
    assert got[:2] == want[:2]
    want = everything(ep.Stream("s").filter(_called(_filter(k, "x"))), pushes)
    got = everything(ep.Stream("s").filter(_filter(k, "x")), pushes)
    assert isinstance(got[2].filters[0].predicate, Expr) and got[:2] == want[:2]


SEQUENCE = st.lists(st.tuples(st.just("s"), EVENT), max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(-3, 4), st.sampled_from(PATTERNS), SEQUENCE)
def test_a_patterns_lambdas_are_lifted_where_every_measure_read_is_set_and_answer_the_same(k, spec, pushes):
    window = ep.Stream("s", window=ep.Tumbling("20ms"))
    step = _pattern(k, spec)
    want = everything(window.then(_called(step)), pushes)
    got = everything(window.then(step), pushes)
    lifted = got[2].terminal
    sequence = spec in PATTERNS[:2]
    assert all(isinstance(p, Expr) for p in lifted.define.values()) is sequence
    assert all(isinstance(d, dict) for d in lifted.do.values()) is sequence
    assert got[:2] == want[:2]          # results and dead letters


def _jepc_pattern(k):
    """JEPC's pattern: the queries' predicates differ in a literal only (``k`` bound once here; the
    same lambdas written in a ``for k`` loop read a variable the loop changes: not lifted)."""
    return ep.Pattern("x y u", {"x": lambda e, m: True, "y": lambda e, m: e["a"] - m["z1"] == k,
                                "u": lambda e, m: e["a"] - m["z2"] == k},
                      do={"x": lambda e, m: {"z1": e["a"]}, "y": lambda e, m: {"z2": e["a"]}})


def test_the_lambdas_of_pattern_queries_differing_in_their_constant_share_one_automaton():
    proc = ep.EventProcessor("native")
    proc.register_stream("s", SCHEMA)
    for k in range(4):
        proc.create_query(k, ep.Stream("s", window=ep.Tumbling("1s")).then(_jepc_pattern(k)))
    assert [op_id for op_id in proc._nodes if not op_id.endswith(".out")] == ["ep_patterns1.s"]
    assert len(proc._nodes["ep_patterns1.s"].op._families) == 1
    proc.close()


def test_each_lambda_kept_as_a_call_is_named_with_why():
    proc = ep.EventProcessor("native")
    for name in "st":
        proc.register_stream(name, SCHEMA)
    proc.create_query("lifted", ep.Stream("s").filter(_filter(1, "x")))
    proc.create_query("divides", ep.Stream("s").filter(lambda e: e["a"] / e["b"] > 1))
    proc.create_query("loop", ep.Stream("s", window=ep.Tumbling("1s")).then(_pattern(1, "x y+ u")))
    proc.create_query("unset", ep.Stream("s", window=ep.Tumbling("1s")).pattern(
        "x y", {"x": lambda e, m: e["f"], "y": lambda e, m: e["a"] == m["z"]}))
    assert proc.python_calls("lifted") == []
    assert proc.python_calls("divides") == [
        "query 'divides': its filter predicate is called: div by what may be 0 (not lifted to an expression)"]
    assert proc.python_calls("loop") == [
        "query 'loop': pattern 'x y+ u' is not a plain sequence of distinct symbols (a measure may be unset "
        "where a lambda reads it): its lambdas are called (not lifted to an expression)"]
    assert proc.python_calls("unset") == [
        "query 'unset': define['y'] is called: measure('z') is not set by a lifted do of every symbol before "
        "(not lifted to an expression)"]
    proc.close()

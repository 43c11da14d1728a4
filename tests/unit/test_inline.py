"""Lambdas inlined into the fused loop (pescheduler/inline.py): only when provably the same code,
with the same results, counts and dead letters as calling them."""

from __future__ import annotations

import linecache

from pescheduler.expr import compile_rows
from pescheduler.inline import inline
from pescheduler.operators.basic import Filter, KeyBy, Map
from pescheduler.testing import run_operators

NONE_TAKEN = lambda name: False  # noqa: E731
LIMIT = 5


def _source(run) -> str:
    return "".join(linecache.getlines(run.__code__.co_filename))


def test_a_one_expression_lambda_runs_in_the_loop_itself():
    to_ms = lambda e: {**e, "speed": e["speed"] / 3.6}  # noqa: E731
    fast = lambda e: e["speed"] > 5 and abs(e["speed"]) < 1e9  # noqa: E731
    assert inline(to_ms, NONE_TAKEN) == ("e", "{**e, 'speed': e['speed'] / 3.6}")
    run = compile_rows([("map", to_ms), ("filter", fast)])
    source = _source(run)
    assert "f0(" not in source and "f1(" not in source          # no call per tuple
    assert "e['speed'] > 5 and abs(e['speed']) < 1000000000.0" in source
    out, drops = run([{"speed": 36.0}, {"speed": 3.6}, {"speed": 72.0}])
    assert out == [{"speed": 10.0}, {"speed": 20.0}] and drops == (0, 1)


def test_lambdas_that_could_differ_in_place_are_called():
    limit = 5
    taken = lambda name: name == "out"  # noqa: E731
    assert inline(lambda e: e["n"] > LIMIT, NONE_TAKEN) is None         # a global: may change
    assert inline(lambda e: e["n"] > limit, NONE_TAKEN) is None         # a closure
    assert inline(lambda e, k=1: e[k], NONE_TAKEN) is None              # a default
    assert inline(lambda e: [x for x in e], NONE_TAKEN) is None         # a scope of its own
    assert inline(lambda e: (y := e) and y, NONE_TAKEN) is None         # binds a name
    assert inline(lambda out: out, taken) is None                       # the loop's own name
    assert inline(lambda e: len(e), lambda name: name == "len") is None
    assert inline(len, NONE_TAKEN) is None and inline(str.upper, NONE_TAKEN) is None

    def named(e):
        return e
    assert inline(named, NONE_TAKEN) is None
    same_line = [lambda e: e + 1, lambda e: e + 2]; second = same_line[1]  # noqa: E702
    assert inline(second, NONE_TAKEN) == ("e", "e + 2")                 # the right one of a line
    shadowed = compile_rows([("map", lambda e: abs(e))])
    assert "abs(e)" in _source(shadowed)
    globals()["abs"] = lambda x: "mine"                                  # the module shadows a builtin now
    try:
        assert inline(lambda e: abs(e), NONE_TAKEN) is None
    finally:
        del globals()["abs"]


def test_an_inlined_lambda_that_raises_dead_letters_only_its_tuple_from_the_users_function():
    events = [{"n": n, "car": n % 2} for n in (4, 2, 0, 1)]
    result = run_operators(events, Map(lambda e: {**e, "r": 8 // e["n"]}), Filter(lambda e: e["r"] > 2),
                           KeyBy("car"), ts_field=None)
    assert [e["r"] for e in result.output] == [4, 8]
    assert [d.item for d in result.dead_letters] == [{"n": 0, "car": 0}]
    assert "ZeroDivisionError" in result.dead_letters[0].error
    assert "test_inline.py" in result.dead_letters[0].error        # the user's line, not the loop's
    nodes = result.chain.nodes
    assert (nodes["map-1"].stats.tuples_out, nodes["filter-2"].stats.tuples_out) == (3, 2)

"""Lambdas lifted to expressions (pescheduler/lift.py, exact_arrow.py): on random events, the lifted
map/filter gives exactly the rows and the dead letters of calling the lambda -- fused on rows, alone
on rows, and on Arrow batches."""

from __future__ import annotations

import linecache

import pyarrow as pa
from hypothesis import HealthCheck, given, settings, strategies as st

from pescheduler import Application
from pescheduler.expr import Py, compile_rows
from pescheduler.lift import lift_steps, python_calls, why_not
from pescheduler.operator import OperatorContext
from pescheduler.operators.basic import Filter, KeyBy, Map
from pescheduler.operators.sources import IterableSource
from pescheduler.testing import CollectingOutput, RunResult, run_operators
from pescheduler.worker.chain import Chain

LIMIT = 5
MAPS = [
    lambda e: {**e, "r": e["a"] / e["b"]},
    lambda e: {**e, "m": e["a"] % e["c"], "n": -e["a"] * 2 + 1},
    lambda e: {"x": e["a"] + e["b"], "ok": e["s"] in ("x", "y"), "k": 7},
    lambda e: {**e, "big": e["a"] * e["a"] * e["a"] - e["c"]},
    lambda e: {**e, "flag": e["f"] and e["a"] > 0, "abs": abs(e["b"]), "q": e["c"] / 4},
    lambda e: {**e, "s": e["s"] == "x", "lt": e["s"] < "y"},
]
FILTERS = [
    lambda e: e["b"] > 5,
    lambda e: e["a"] is not None and e["a"] > 1,
    lambda e: 0 <= e["a"] < 3 or e["s"] == "x",
    lambda e: not e["f"],
    lambda e: e["a"] % 2 == 0 and e["s"] not in ["y"],
    lambda e: e["a"] != e["b"],
    lambda e: e["f"],
]
INTS = st.one_of(st.integers(-4, 4), st.sampled_from([2 ** 53 + 1, -(2 ** 62), 2 ** 62]))
COLUMNS = {"a": INTS, "b": st.floats(-100, 100, allow_nan=False), "c": INTS,
           "s": st.sampled_from(["x", "y", "z"]), "f": st.booleans()}


def events(missing: bool) -> st.SearchStrategy:
    """Events of consistently typed fields, some None (and some missing, for rows)."""
    def field(name: str) -> st.SearchStrategy:
        return st.one_of(st.none(), COLUMNS[name]) if name != "a" else COLUMNS[name] | st.none()
    event = st.fixed_dictionaries({name: field(name) for name in COLUMNS})
    if missing:
        event = st.tuples(event, st.sets(st.sampled_from(list(COLUMNS)), max_size=1)).map(
            lambda pair: {k: v for k, v in pair[0].items() if k not in pair[1]})
    return st.lists(event, max_size=30)


def called(kind: str, fn, items: list) -> tuple[list, list]:
    """What calling ``fn`` per item gives: the output, and each dead item with its error's last line."""
    out, dead = [], []
    for item in items:
        try:
            value = fn(item)
        except Exception as exc:
            dead.append((item, f"{type(exc).__name__}: {exc}"))
            continue
        if kind == "map":
            out.append(value)
        elif value:
            out.append(item)
    return out, dead


def seen(result: RunResult) -> tuple[list, list]:
    return result.output, [(d.item, d.error.strip().splitlines()[-1]) for d in result.dead_letters]


def run_columns(batch: pa.RecordBatch, *operators) -> RunResult:
    """``operators`` in a chain fed one Arrow batch (as a columnar source's batch arrives)."""
    ops = {"source-0": IterableSource(items=[]), **{f"op-{i}": op for i, op in enumerate(operators, 1)}}
    ids = list(ops)
    edges = [(a, "out", b) for a, b in zip(ids, ids[1:])]
    result = RunResult()
    chain = Chain(ops, edges, {(ids[-1], "out"): [CollectingOutput(result)]})
    for op_id, op in ops.items():
        op.open(OperatorContext(op_id=op_id, pe_id="test", extra={"inputs": []}))
    chain.emit_from("source-0", batch)
    result.dead_letters = chain.dead_letters
    return result


def operator(kind: str, fn):
    op = (Map if kind == "map" else Filter)(fn)
    assert all(step in ("assign", "project", "where") for step, _ in op.steps), op.steps     # lifted
    return op


CASES = [("map", fn) for fn in MAPS] + [("filter", fn) for fn in FILTERS]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CASES), events(missing=True))
def test_a_lifted_lambda_on_rows_gives_what_calling_it_gives(case, items):
    kind, fn = case
    want = called(kind, fn, items)
    assert seen(run_operators(items, operator(kind, fn), ts_field=None)) == want            # alone
    fused = run_operators(items, operator(kind, fn), KeyBy("a"), ts_field=None)           # fused
    assert seen(fused) == want
    assert [d.operator for d in fused.dead_letters] == ["map-1" if kind == "map" else "filter-1"] * len(want[1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CASES), events(missing=False))
def test_a_lifted_lambda_on_an_arrow_batch_gives_what_calling_it_gives(case, items):
    kind, fn = case
    schema = pa.schema([("a", pa.int64()), ("b", pa.float64()), ("c", pa.int64()), ("s", pa.string()),
                        ("f", pa.bool_())])
    batch = pa.RecordBatch.from_pylist(items, schema=schema)
    assert seen(run_columns(batch, operator(kind, fn))) == called(kind, fn, batch.to_pylist())


def test_clean_columns_stay_columnar_and_a_dirty_batch_is_replayed_by_the_users_function():
    batch = pa.RecordBatch.from_pylist([{"speed": 36, "ts": 1}, {"speed": 72, "ts": 2}])
    to_ms, fast = Map(lambda e: {**e, "speed": e["speed"] / 3.6}), Filter(lambda e: e["speed"] > 15)
    assert to_ms.columnar and fast.columnar                  # an Arrow batch reaches them whole
    clean = run_columns(batch, to_ms, fast)
    assert clean.output == [{"speed": 20.0, "ts": 2}] and not clean.dead_letters
    ops = Map(lambda e: {**e, "r": 10 / e["speed"]})
    dirty = run_columns(pa.RecordBatch.from_pylist([{"speed": 5}, {"speed": 0}]), ops)
    assert dirty.output == [{"speed": 5, "r": 2.0}]
    assert [d.item for d in dirty.dead_letters] == [{"speed": 0}]
    assert "ZeroDivisionError" in dirty.dead_letters[0].error and "test_lift.py" in dirty.dead_letters[0].error


def test_the_readmes_lambdas_compile_to_the_fused_loop_without_a_call():
    steps = lift_steps("map", lambda e: {**e, "speed": e["speed"] / 3.6}) + \
        lift_steps("filter", lambda e: e["speed"] > 5)
    run = compile_rows(steps)
    source = "".join(linecache.getlines(run.__code__.co_filename))
    assert "f0(" not in source and "f1(" not in source and "(t['speed'] / 3.6)" in source
    assert run([{"speed": 36}, {"speed": 3.6}]) == ([{"speed": 10.0}], (0, 1))
    assert repr(steps[1][1]) == "py((col('speed') > 5))"


def test_what_is_not_provably_the_same_stays_a_call_and_says_why():
    limit = 5
    limit += 1
    assert why_not("filter", lambda e: e["n"] > LIMIT) == "it reads the global 'LIMIT', which may change"
    assert why_not("filter", lambda e: e["n"] > limit) == \
        "it reads 'limit' of an enclosing function, which is bound 2 times: it may change"
    assert why_not("map", lambda e: e["n"]) == "it returns no dict display ({...})"
    assert why_not("filter", lambda e: len(e) > 1) == "it calls len, which has no expression"
    assert "e['a']['b']" in why_not("filter", lambda e: e["a"]["b"] > 1)
    assert why_not("filter", lambda e: e["a"] // 2 > 1) == "`e['a'] // 2`: only + - * / % have expressions"
    assert why_not("map", lambda e: {**e, 1: 2}).startswith("its dict display has a key")
    assert why_not("map", lambda e: {"a": 1, **e}).startswith("its dict display spreads")
    assert why_not("filter", lambda e: e["s"] in {"x"}).startswith("`in {'x'}`")

    def named(e):
        return e["n"] > 1
    assert why_not("filter", named) == "it is not a lambda"
    assert why_not("filter", lambda e: e["n"] > 1) is None
    op = Filter(lambda e: e["n"] > LIMIT)
    assert op.steps[0][0] == "filter" and not op.columnar


def test_the_deployment_notes_each_function_left_a_call_once():
    app = Application("notes")
    (app.source("iterable", items=[{"n": 1}])
        .map(lambda e: {**e, "m": e["n"] * 2})
        .filter(lambda e: e["m"] > LIMIT, id="over")
        .sink("discard"))
    assert python_calls(app) == ["over calls its function per tuple (not lifted to an expression): "
                                 "it reads the global 'LIMIT', which may change"]
    assert isinstance(lift_steps("filter", lambda e: e["m"] > 2)[0][1], Py)


# -- variables of an enclosing function (closure cells) ----------------------------------------

def _above(limit):
    return lambda e: e["n"] > limit


def _one_of(names):
    return lambda e: e["s"] in names


def _assigned_once():
    scale = 2.5
    return lambda e: {**e, "x": e["n"] * scale}


def _assigned_again(limit):
    f = lambda e: e["n"] > limit  # noqa: E731
    limit = limit + 1
    return f


def _in_a_loop():
    fs = []
    for k in range(3):
        step = k
        fs.append(lambda e: e["n"] > step)
    return fs[0]


def _nonlocal_changes(limit):
    f = lambda e: e["n"] > limit  # noqa: E731

    def bump():
        nonlocal limit
        limit += 1
    bump()
    return f


def test_a_variable_bound_once_in_the_enclosing_function_is_read_as_a_literal():
    assert repr(lift_steps("filter", _above(3))[0][1]) == "py((col('n') > 3))"
    assert repr(lift_steps("filter", _one_of(("a", "b")))[0][1]) == "py((col('s') in ('a', 'b', )))"
    assert repr(lift_steps("map", _assigned_once())[0][1]["x"]) == "py((col('n') * 2.5))"


def test_a_variable_that_may_change_or_is_not_a_constant_keeps_the_call():
    assert "is assigned although a parameter" in why_not("filter", _assigned_again(3))
    assert "is assigned in a loop" in why_not("filter", _in_a_loop())
    assert "is assigned although a parameter" in why_not("filter", _nonlocal_changes(3))   # nonlocal, +=
    assert "a list (an int, float, str" in why_not("filter", _above([1]))
    assert "a list (an int, float, str" in why_not("filter", _one_of(["a"]))
    assert "bool" not in (why_not("filter", _above(True)) or "")
    assert "a Flag" in why_not("filter", _above(Flag(1)))          # a subclass may redefine ==


class Flag(int):
    def __gt__(self, other):
        return True

"""``when``/``coalesce``: the same values on rows (generated Python), the Python callable, Arrow
kernels, and SQL (DuckDB as the oracle, through ``pescheduler.sql``)."""

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pescheduler import Application, coalesce, col, lit, when
from pescheduler.expr import compile_rows, run_arrow
from pescheduler.sql import sql
from pescheduler.testing import run_stream
from sql_oracle import duckdb_rows, same_rows

ROWS = [{"a": 6, "b": 3, "x": 1.5, "s": "p"},
        {"a": 5, "b": 0, "x": None, "s": "q"},
        {"a": None, "b": 2, "x": -2.0, "s": None}]
SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("x", pa.float64()), ("s", pa.string())])


def values(backend, e, rows=ROWS):
    steps = [("assign", {"y": e})]
    if backend == "rows":
        out = compile_rows(steps)(rows)[0]
    elif backend == "callable":
        return [e(r) for r in rows]
    else:
        out = run_arrow(steps, pa.RecordBatch.from_pylist(rows, schema=SCHEMA)).to_pylist()
    return [r["y"] for r in out]


BACKENDS = ["rows", "callable", "arrow"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_first_true_case_wins_and_a_null_condition_is_not_true(backend):
    size = when(col("a") > 5, "big").when(col("a") > 0, "small").otherwise("none")
    assert values(backend, size) == ["big", "small", "none"]         # a is null: neither case is true
    assert values(backend, when(col("b") == 0, col("a"))) == [None, 5, None]   # no otherwise: null
    assert values(backend, when(col("x") < 0, -col("x")).otherwise(col("x") * 2)) == [3.0, None, 2.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_coalesce_is_the_first_value_not_null(backend):
    assert values(backend, coalesce(col("a"), col("b") * 10)) == [6, 5, 20]
    assert values(backend, coalesce(col("x"), col("a"), -1.0)) == [1.5, 5, -2.0]
    assert values(backend, coalesce(col("s"), "?")) == ["p", "q", "?"]
    assert values(backend, coalesce(lit(None), col("s"))) == ["p", "q", None]


@pytest.mark.parametrize("backend", ["rows", "callable"])
def test_a_branch_not_taken_is_not_evaluated_on_rows(backend):
    """As in Python and SQL: the value of a case whose condition is not true is never computed, so
    a field it reads may be missing and a comparison it makes may be of different kinds."""
    rows = [{"a": 1, "s": "p"}, {"a": 2}]
    e = when(col("a") == 2, col("a")).when(col("a") == 1, col("s")).otherwise(col("s") < 3)
    assert values(backend, e, rows) == ["p", 2]
    assert values(backend, coalesce(col("a"), col("missing")), rows) == [1, 2]


def test_conditionals_pickle_print_and_refuse_a_case_after_the_default():
    import pickle

    e = when(col("a") > 1, 1).otherwise(coalesce(col("b"), 0))
    assert pickle.loads(pickle.dumps(e)).same(e)
    assert repr(e) == "when((col('a') > lit(1)), lit(1)).otherwise(coalesce(col('b'), lit(0)))"
    assert e.columns() == {"a", "b"}
    with pytest.raises(ValueError, match="the default comes last"):
        e.when(col("a") > 2, 2)


# -- random expressions: rows == Arrow, and SQL == DuckDB ----------------------------------------
NUMBERS = [{"a": a, "b": b, "x": x, "s": s} for a, b, x, s in
           [(1, 2, 0.5, "p"), (None, 0, -1.0, "q"), (3, None, None, None), (-4, 7, 2.5, "p"), (0, 0, 0.0, "r")]]


@st.composite
def trees(draw, depth=2):
    """A random numeric expression over a, b, x with when/coalesce."""
    leaves = st.sampled_from([col("a"), col("b"), col("x"), lit(None), lit(2), lit(-1.5)])
    if depth == 0:
        return draw(leaves)
    sub = trees(depth=depth - 1)
    kind = draw(st.sampled_from(["leaf", "add", "when", "when2", "coalesce"]))
    if kind == "leaf":
        return draw(leaves)
    if kind == "add":
        return draw(sub) + draw(sub)
    if kind == "coalesce":
        return coalesce(*draw(st.lists(sub, min_size=1, max_size=3)))
    cond = draw(sub) > draw(sub)
    e = when(cond, draw(sub))
    if kind == "when2":
        e = e.when(draw(sub).is_null(), draw(sub))
    return e.otherwise(draw(sub)) if draw(st.booleans()) else e


@settings(max_examples=150, deadline=None)
@given(e=trees())
def test_random_conditionals_give_the_same_values_on_rows_the_callable_and_arrow(e):
    rows, arrow = values("rows", e, NUMBERS), values("arrow", e, NUMBERS)
    assert values("callable", e, NUMBERS) == rows
    assert len(arrow) == len(rows) and all(
        (p is None and q is None) or (p is not None and q is not None and float(p) == float(q))
        for p, q in zip(rows, arrow)), (e, rows, arrow)


COLUMNS = {"car": "VARCHAR", "speed": "BIGINT", "ts": "BIGINT"}
CONDITIONALS = ["CASE WHEN speed > {n} THEN 'fast' WHEN speed > {m} THEN 'ok' ELSE 'slow' END AS band",
                "CASE WHEN speed > {n} THEN speed * 2 END AS doubled",
                "CASE car WHEN 'c1' THEN speed WHEN 'c2' THEN -speed ELSE {m} END AS signed",
                "IF(speed < {n}, speed, {m}) AS capped",
                "COALESCE(CASE WHEN speed > {n} THEN speed END, {m}) AS floor_or",
                "COALESCE(CASE WHEN car = 'c0' THEN NULL ELSE car END, 'zero') AS label"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(st.sampled_from(CONDITIONALS), min_size=1, max_size=3, unique=True),
       n=st.integers(-5, 40), m=st.integers(-5, 40), where=st.booleans(), seed=st.integers(0, 10_000))
def test_case_if_and_coalesce_in_sql_give_what_duckdb_gives(items, n, m, where, seed):
    import random

    rng = random.Random(seed)
    rows = [{"car": f"c{rng.randrange(4)}", "speed": rng.randrange(-5, 40), "ts": i} for i in range(60)]
    cond = f" WHERE CASE WHEN car = 'c3' THEN speed > {n} ELSE speed < {m} END" if where else ""
    query = f"SELECT car, {', '.join(items)} FROM cars{cond}".format(n=n, m=m)
    stream = sql(query, {"cars": Application("sql").source("iterable", items=rows)})
    result = run_stream(stream, max_delay=0)
    assert not result.dead_letters, result.dead_letters[0].error
    assert same_rows(result.output, duckdb_rows(query, {"cars": rows}, COLUMNS)), query

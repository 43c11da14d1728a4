"""SQL joins (interval, as-of, temporal) compiled to the join operators, with DuckDB as the oracle:
the same query (the temporal one in DuckDB's ASOF form) over the same rows, as a batch."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pescheduler import Application
from pescheduler.sql import SQLError, explain, sql
from pescheduler.testing import run_graph
from sql_oracle import duckdb_rows, same_rows

COLUMNS = {"k": "BIGINT", "v": "BIGINT", "ts": "BIGINT"}


def rows(seed: int, n: int, unique_ts: bool) -> list[dict]:
    """``n`` rows of 4 keys by ts; ``unique_ts``: no two rows of a key at one time (an as-of tie
    DuckDB breaks arbitrarily)."""
    rng = random.Random(seed)
    ts = sorted(rng.sample(range(20 * n), n) if unique_ts else (rng.randrange(20 * n) for _ in range(n)))
    return [{"k": rng.randrange(4), "v": rng.randrange(-20, 20), "ts": t} for t in ts]


def run_query(query: str, trades: list, quotes: list):
    app = Application("sql-join")
    streams = {"trades": app.source("iterable", items=trades, max_delay=0),
               "quotes": app.source("iterable", items=quotes, max_delay=0)}
    result = run_graph(sql(query, streams))
    assert not result.dead_letters, result.dead_letters[0].error
    assert "late" not in result.sides
    return result.output


WHERE = ["", " WHERE q.v > {n}", " WHERE t.v - q.v <= {n} AND t.k <> 2"]
SELECT = "SELECT t.k, t.v AS tv, q.v AS qv, t.ts AS tts, q.ts AS qts"


@st.composite
def interval_queries(draw) -> str:
    a, b = draw(st.integers(-300, 300)), draw(st.integers(0, 300))
    low, high = (f"{{s}}.ts - {-x}" if x < 0 else f"{{s}}.ts + {x}" for x in (a, a + b))
    where = draw(st.sampled_from(WHERE)).format(n=draw(st.integers(-10, 10)))
    subject = draw(st.sampled_from([f"t.ts BETWEEN {low} AND {high}".format(s="q"),
                                    f"q.ts BETWEEN {low} AND {high}".format(s="t")]))
    return f"{SELECT} FROM trades t JOIN quotes q ON t.k = q.k AND {subject}{where}"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=interval_queries(), seed=st.integers(0, 10_000))
def test_interval_joins_give_what_duckdb_gives(query, seed):
    trades, quotes = rows(seed, 150, False), rows(seed + 1, 150, False)
    expected = duckdb_rows(query, {"trades": trades, "quotes": quotes}, COLUMNS)
    assert same_rows(run_query(query, trades, quotes), expected), query


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(left=st.booleans(), op=st.sampled_from([">=", "<="]), where=st.sampled_from(WHERE),
       n=st.integers(-10, 10), seed=st.integers(0, 10_000))
def test_asof_joins_give_what_duckdb_gives(left, op, where, n, seed):
    join = "ASOF LEFT JOIN" if left else "ASOF JOIN"
    query = f"{SELECT} FROM trades t {join} quotes q ON t.k = q.k AND t.ts {op} q.ts{where.format(n=n)}"
    trades, quotes = rows(seed, 150, True), rows(seed + 1, 60, True)
    expected = duckdb_rows(query, {"trades": trades, "quotes": quotes}, COLUMNS)
    assert same_rows(run_query(query, trades, quotes), expected), query


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(left=st.booleans(), seed=st.integers(0, 10_000))
def test_temporal_join_over_a_changelog_gives_duckdbs_asof_join(left, seed):
    """``FOR SYSTEM_TIME AS OF`` reads quotes as a changelog (each an upsert of its key's row)."""
    side = "LEFT " if left else ""
    query = (f"SELECT t.k, t.v AS tv, q.v AS qv FROM trades t {side}JOIN quotes FOR SYSTEM_TIME AS OF t.ts AS q "
             f"ON t.k = q.k")
    oracle = f"SELECT t.k, t.v AS tv, q.v AS qv FROM trades t ASOF {side}JOIN quotes q ON t.k = q.k AND t.ts >= q.ts"
    trades, quotes = rows(seed, 150, True), rows(seed + 1, 60, True)
    changes = [{"op": "upsert", "k": q["k"], "row": q, "ts": q["ts"]} for q in quotes]
    expected = duckdb_rows(oracle, {"trades": trades, "quotes": quotes}, COLUMNS)
    assert same_rows(run_query(query, trades, changes), expected)


def test_each_form_is_one_join_operator_and_intervals_are_durations():
    app = Application("explain")
    streams = {"trades": app.source("iterable", items=[]), "quotes": app.source("iterable", items=[])}
    shown = explain("SELECT t.v AS tv FROM trades t JOIN quotes q ON t.k = q.k AND "
                    "t.ts BETWEEN q.ts - INTERVAL '5' SECOND AND q.ts", streams)
    assert "join(lower=0, upper=5000, ts_field='ts', on='k') <- iterable-1, iterable-2" in shown
    shown = explain("SELECT t.v AS tv FROM trades t ASOF JOIN quotes q ON t.k = q.k AND q.ts <= t.ts", streams)
    assert "join_asof(by='k', on='ts', tolerance=None, direction='backward')" in shown
    shown = explain("SELECT t.v AS tv FROM trades t JOIN quotes FOR SYSTEM_TIME AS OF t.ts AS q "
                    "ON t.k = q.k", streams)
    assert "lookup(key='k', as_of=True, on='ts')" in shown


@pytest.mark.parametrize("query, message", [
    ("SELECT t.k FROM trades t JOIN quotes q ON t.k = q.k AND t.ts BETWEEN q.ts AND q.ts + 5 "
     "JOIN quotes r ON t.k = r.k", "one JOIN per SELECT"),
    ("SELECT t.k, COUNT(*) AS n FROM trades t JOIN quotes q ON t.k = q.k AND t.ts BETWEEN q.ts AND q.ts + 5 "
     "GROUP BY t.k", "does not aggregate"),
    ("SELECT t.k FROM trades t JOIN quotes q ON t.k = q.k AND t.v > q.v", "bounds the times"),
    ("SELECT t.k FROM trades t ASOF JOIN quotes q ON t.k = q.k AND t.ts > q.ts", "ASOF JOIN compares"),
    ("SELECT t.k FROM trades t JOIN quotes FOR SYSTEM_TIME AS OF q.ts AS q ON t.k = q.k", "left side's time"),
    ("SELECT t.k FROM trades t JOIN quotes q ON t.k = q.k AND t.ts BETWEEN q.ts AND q.ts + 5 AND t.v > 0",
     "put other conditions in WHERE"),
    ("SELECT t.k FROM trades t JOIN trucks q ON t.k = q.k AND t.ts BETWEEN q.ts AND q.ts + 5", "unknown source 'trucks'"),
])
def test_unsupported_joins_are_errors_naming_them(query, message):
    with pytest.raises(SQLError, match=message) as caught:
        run_query(query, [], [])
    assert caught.value.line == 1

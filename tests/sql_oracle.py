"""DuckDB as the oracle of pescheduler's streaming SQL: the same query over the same rows, as a batch.

:func:`to_duckdb` rewrites only the window table function (DuckDB has none):
``TUMBLE``/``HOP``/``SESSION(source, ts, ...)`` becomes a sub-query adding
``window_start``/``window_end`` (ms) to each row of the source, a HOP row once
per window it falls in, a SESSION row with its session's bounds (per GROUP BY
key: events less than ``gap`` apart). The SELECT's WHERE moves into that
sub-query, because the stream filters rows before windows form (it decides
which events make a session). Everything else is the query as written.
"""

from __future__ import annotations

import math

import sqlglot
from sqlglot import exp

from pescheduler.sql.parse import WINDOW_FUNCTIONS, normalise
from pescheduler.sql.plan import WINDOW_FIELDS, _interval

TUMBLE = "SELECT *, {ts} // {size} * {size} AS window_start, {ts} // {size} * {size} + {size} AS window_end FROM {src}"
HOP = ("SELECT *, w AS window_start, w + {size} AS window_end FROM {src}, "
       "unnest(range({ts} // {slide} * {slide} - {size} + {slide}, {ts} // {slide} * {slide} + 1, {slide})) AS u(w)")
SESSION = ("SELECT *, MIN({ts}) OVER (PARTITION BY {key}, sid) AS window_start, "
           "MAX({ts}) OVER (PARTITION BY {key}, sid) + {size} AS window_end FROM ("
           "SELECT *, SUM(CASE WHEN prev IS NULL OR {ts} - prev >= {size} THEN 1 ELSE 0 END) "
           "OVER (PARTITION BY {key} ORDER BY {ts} ROWS UNBOUNDED PRECEDING) AS sid FROM ("
           "SELECT *, LAG({ts}) OVER (PARTITION BY {key} ORDER BY {ts}) AS prev FROM {src}))")


def to_duckdb(query: str) -> str:
    """``query`` with its window table functions expanded for DuckDB."""
    tree = sqlglot.parse_one(normalise(query))
    for concat in tree.find_all(exp.Concat):     # CONCAT skips nulls (docs/sql.md); sqlglot's default
        concat.set("coalesce", True)             # dialect reads it as ||, which does not
    for select in list(tree.find_all(exp.Select)):
        table = select.args["from_"].this
        call = table.this if isinstance(table, exp.Table) else table
        if isinstance(call, exp.Anonymous) and call.name.upper() in WINDOW_FUNCTIONS:
            select.set("from_", exp.From(this=_windowed(select, call, query)))
    return tree.sql(dialect="duckdb")


def _windowed(select: exp.Select, call: exp.Anonymous, query: str) -> exp.Expression:
    src, ts = call.expressions[0].name, call.expressions[1].name
    where = select.args.get("where")
    if where is not None:
        src = f"(SELECT * FROM {src} WHERE {where.this.sql(dialect='duckdb')})"
        select.set("where", None)
    sizes = [_interval(a, query) for a in call.expressions[2:]]
    keys = [k.name for k in select.args["group"].expressions if k.name not in WINDOW_FIELDS]
    template = {"tumble": TUMBLE, "hop": HOP, "session": SESSION}[WINDOW_FUNCTIONS[call.name.upper()]]
    params = {"src": src, "ts": ts, "size": sizes[-1], "slide": sizes[0], "key": keys[0] if keys else "1"}
    return sqlglot.parse_one(template.format(**params), read="duckdb").subquery("windowed")


def duckdb_rows(query: str, tables: dict[str, list[dict]], columns: dict[str, str]) -> list[dict]:
    """``query`` (pescheduler SQL) run by DuckDB over ``tables`` (name -> rows; ``columns``: name -> type)."""
    import duckdb

    con = duckdb.connect()
    try:
        for table, rows in tables.items():
            con.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {t}' for c, t in columns.items())})")
            if rows:
                con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(columns))})",
                                [tuple(r[c] for c in columns) for r in rows])
        cursor = con.execute(to_duckdb(query))
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, values)) for values in cursor.fetchall()]
    finally:
        con.close()


def same_rows(got: list[dict], expected: list[dict]) -> bool:
    """Equal as multisets of rows; floats to 1e-9 relative (DuckDB adds in another order); NULLs
    (a LEFT JOIN's) sort first."""
    def key(row):
        return tuple(sorted((k, v is not None, round(v, 6) if isinstance(v, float) else v)
                            for k, v in row.items()))
    got, expected = sorted(got, key=key), sorted(expected, key=key)
    return len(got) == len(expected) and all(
        g.keys() == e.keys() and all(_close(g[k], e[k]) for k in g) for g, e in zip(got, expected))


def _close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return a == b

"""The string functions and NULLIF give one answer on every backend: rows (generated Python),
Arrow, and the ep databases; DuckDB running the same SQL is the oracle (issue 33).

Where an engine would answer otherwise the function is refused there by name (SQLite's
ASCII-only UPPER, its LENGTH stopping at a NUL; every database's own case mapping)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pescheduler import ep
from pescheduler.expr import (Func, col, compile_rows, concat, evaluate_arrow, length, lower, ltrim, nullif, position,
                              lit, replace, rtrim, substring, trim, upper, when)
from pescheduler.strings import Unsupported

# text with what engines disagree on: non-ASCII letters, an astral character, wildcards, a backslash,
# regex characters, a tab, a newline, a NUL, spaces at the ends
EVERYTHING = st.text(alphabet=st.sampled_from(list("aAb c%_\\\t\n\x00.[éß😀İ")), max_size=8)
UNCASED = st.text(alphabet=st.sampled_from(list("aAbZ c%_\\\t\n\x00.[😀1")), max_size=8)   # no non-ASCII letters

# (the expression, the same in DuckDB's SQL): s, t text, p an integer position
CASES = {
    "length": (length(col("s")), "length(s)"),
    "substring": (substring(col("s"), col("p"), col("n")), "substring(s, p, n)"),
    "substring_to_end": (substring(col("s"), col("p")), "substring(s, p)"),
    "trim": (trim(col("s")), "trim(s)"),
    "ltrim": (ltrim(col("s")), "ltrim(s)"),
    "rtrim": (rtrim(col("s")), "rtrim(s)"),
    "concat": (concat(col("s"), "-", col("t")), "s || '-' || t"),
    "replace": (replace(col("s"), col("t"), "<>"), "replace(s, t, '<>')"),
    "position": (position(col("t"), col("s")), "position(t IN s)"),
    "like": (col("s").like(col("t")), "s LIKE t"),
    "like_constant": (col("s").like("a%_"), "s LIKE 'a%_'"),
    "nullif": (nullif(col("s"), col("t")), "nullif(s, t)"),
    "upper": (upper(col("s")), "upper(s)"),
    "lower": (lower(col("s")), "lower(s)"),
}
CASED = {"upper", "lower"}


def rows_of(texts: st.SearchStrategy) -> st.SearchStrategy:
    maybe = st.one_of(st.none(), texts)
    return st.lists(st.fixed_dictionaries({"s": maybe, "t": st.one_of(maybe, st.sampled_from(["a", "", "%", "_"])),
                                           "p": st.one_of(st.none(), st.integers(-3, 9)),
                                           "n": st.one_of(st.none(), st.integers(-2, 9))}), min_size=1, max_size=12)


def on_rows(e, rows):
    run = compile_rows([("project", {"x": e})])
    out, _ = run(rows)
    return [r["x"] for r in out]


def on_arrow(e, rows):
    batch = pa.RecordBatch.from_pylist(rows, schema=pa.schema([("s", pa.string()), ("t", pa.string()),
                                                                ("p", pa.int64()), ("n", pa.int64())]))
    out = evaluate_arrow(e, batch)
    return [out.as_py()] * len(rows) if isinstance(out, pa.Scalar) else out.to_pylist()


def on_duckdb(sql, rows):
    if not rows:
        return []
    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE r (i BIGINT, s VARCHAR, t VARCHAR, p BIGINT, n BIGINT)")
        con.executemany("INSERT INTO r VALUES (?, ?, ?, ?, ?)",
                        [(i, r["s"], r["t"], r["p"], r["n"]) for i, r in enumerate(rows)])
        return [v for _, v in con.execute(f"SELECT i, {sql} FROM r ORDER BY i").fetchall()]
    finally:
        con.close()


def sql_rows(name, rows):
    """The rows on which DuckDB's SQL means what standard SQL does: SUBSTRING from 1 with a count
    of 0 or more (DuckDB counts a start below 1 from the end, and a negative count backwards)."""
    if name.startswith("substring"):
        return [r for r in rows if (r["p"] is None or r["p"] >= 1) and (r["n"] is None or r["n"] >= 0)]
    return rows


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(everything=rows_of(EVERYTHING), uncased=rows_of(UNCASED))
def test_rows_arrow_and_duckdb_agree(name, everything, uncased):
    e, sql = CASES[name]
    assert on_rows(e, everything) == on_arrow(e, everything), repr(e)
    oracle = sql_rows(name, uncased if name in CASED else everything)
    assert on_rows(e, oracle) == on_duckdb(sql, oracle), repr(e)


@pytest.mark.parametrize("start, count, want", [
    (0, 3, "he"), (-2, 5, "he"), (-2, None, "hello"), (-2, 2, ""), (2, -1, None), (4, 9, "lo"), (9, 2, ""),
    (1, 0, ""), (None, 2, None)])
def test_substring_takes_sqls_positions_before_the_first_character(start, count, want):
    """Standard SQL (PostgreSQL's ``substring('hello' from 0 for 3)``): a start before 1 shortens
    the count, it does not count from the end (DuckDB's and SQLite's SUBSTR do); a negative count,
    an error in SQL, gives null as a division by zero does."""
    e = substring(col("s"), start, count) if count is not None else substring(col("s"), start)
    if count is None and start is not None:
        want = "hello"[max(start, 1) - 1:]
    rows = [{"s": "hello", "t": None, "p": None, "n": None}]
    assert on_rows(e, rows) == on_arrow(e, rows) == [want]


def test_length_counts_characters_and_upper_maps_all_of_unicode():
    rows = [{"s": "é😀\x00ß", "t": None, "p": None, "n": None}]
    assert on_rows(length(col("s")), rows) == on_arrow(length(col("s")), rows) == [4]
    assert on_rows(upper(col("s")), rows) == on_arrow(upper(col("s")), rows) == ["É😀\x00SS"]


def test_every_builder_of_the_tree_is_a_top_level_name_as_col_is():
    """One way to import an expression: ``from pescheduler import col, upper, nullif`` (the home module,
    ``pescheduler.expr``, holds the same objects)."""
    import pescheduler
    import pescheduler.expr
    from pescheduler.strings import FUNCTIONS

    builders = ["col", "lit", "when", "coalesce", "nullif", *(f for f in FUNCTIONS if f != "like")]   # like: a method
    assert [b for b in builders if b not in pescheduler.__all__] == []
    assert all(getattr(pescheduler, b) is getattr(pescheduler.expr, b) for b in builders)


def test_text_functions_refuse_values_that_are_not_text():
    run = compile_rows([("where", length(col("s")) > 1)])
    with pytest.raises(TypeError, match="LENGTH takes text, got int"):
        run([{"s": 12}])
    with pytest.raises(TypeError, match="takes 1 arguments, got 2"):
        Func("upper", col("s"), 1)


# -- the ep databases: the same rows as the native engine, or a refusal naming function and provider ---

EVENTS = ["  hello ", "abc", "a_c", "ÉTÉ", "x-y-x", ""]
ON_EVERY_DATABASE = [concat(ep.col("id"), "!") == "abc!", trim(ep.col("id")) == "hello",
                     ltrim(ep.col("id")) == "hello ", rtrim(ep.col("id")) == "  hello",
                     replace(ep.col("id"), "x", "") == "-y-", nullif(ep.col("id"), "abc").is_null()]
NOT_ON_SQLITE = [length(ep.col("id")) == 3, substring(ep.col("id"), 0, 2) == "a", position("c", ep.col("id")) == 3,
                 ep.col("id").like("a_c"), substring(ep.col("id"), 2) == "bc",
                 substring(concat(ep.col("id"), "!"), 2, -1).is_null(),     # null, yet its text's literal bound
                 position("y", concat(ep.col("id"), "!")) == 3]               # two literals, bound in order


def matching(provider, predicate):
    proc = ep.EventProcessor(provider)
    try:
        proc.register_stream("s", {"id": str})
        rows = []
        proc.create_query("q", ep.Stream("s").filter(predicate))
        proc.add_output_processor("q", rows.append)
        for ts, text in enumerate(EVENTS):
            proc.push_event("s", {"id": text}, ts + 1)
    finally:
        proc.close()
    return sorted(r["id"] for r in rows)


@pytest.mark.parametrize("i", range(len(ON_EVERY_DATABASE + NOT_ON_SQLITE)))
def test_databases_give_the_native_engines_rows(i):
    predicate = (ON_EVERY_DATABASE + NOT_ON_SQLITE)[i]
    native = matching("native", predicate)
    assert native, f"{predicate!r} matches nothing: the test would prove nothing"
    assert matching("duckdb", predicate) == native
    if i < len(ON_EVERY_DATABASE):
        assert matching("sqlite", predicate) == native


@pytest.mark.parametrize("provider, predicate, name", [
    ("sqlite", upper(ep.col("id")) == "ABC", "UPPER"), ("sqlite", length(ep.col("id")) == 3, "LENGTH"),
    ("sqlite", ep.col("id").like("a%"), "LIKE"), ("duckdb", lower(ep.col("id")) == "été", "LOWER"),
    ("duckdb", substring(ep.col("id"), ep.col("id")) == "x", "SUBSTRING"),
    *(pytest.param("postgresql", predicate, name, marks=pytest.mark.database) for predicate, name in [
        (upper(ep.col("id")) == "ABC", "UPPER"), (lower(ep.col("id")) == "été", "LOWER"),
        (substring(ep.col("id"), 1, length(ep.col("id"))) == "x", "SUBSTRING")])], indirect=["provider"])
def test_a_database_that_would_answer_otherwise_refuses_naming_function_and_provider(provider, predicate, name):
    kind = provider if provider in ("sqlite", "duckdb") else "postgresql"
    with pytest.raises(Unsupported, match=f"{name} cannot run on the {kind} provider"):
        matching(provider, predicate)


def test_the_cli_refuses_an_unsupported_construct_with_exit_2_naming_it(tmp_path, capsys):
    from pescheduler import cli

    query = tmp_path / "q.sql"
    query.write_text('-- source cars: generator {"events": 10}\n-- sink: print\n'
                     "SELECT car, car ILIKE 'C%' AS c FROM cars\n")
    assert cli.main(["deploy", str(query), "--explain"]) == 2
    assert "ILIKE is not supported" in capsys.readouterr().err


# -- PostgreSQL: the same cases through the ep provider on a real server (tests/unit/conftest.py) ----
# A stream's schema has no nulls, so a null argument is written nullif(field, NULL[field]): null where
# the event holds that marker. PostgreSQL's text cannot hold a NUL character: such text is refused (below).

NULL = {"s": "∅", "t": "∄"}      # one each: a bound value taken for another's shows
NO_NUL = st.text(alphabet=st.sampled_from(list("aAb c%_\\\t\n.[éß😀İ")), max_size=8)
POSITIONS = st.one_of(st.none(), st.integers(-3, 9), st.sampled_from([-2 ** 40, 2 ** 31, 2 ** 40]))
COUNTS = st.one_of(st.integers(-2, 9), st.sampled_from([2 ** 31 - 1, 2 ** 31, 2 ** 40]))

# CASES on (s, t): nullable text, p and n: constant positions (PostgreSQL, as DuckDB, takes only those)
ON_POSTGRESQL = {
    "length": lambda s, t, p, n: length(s),
    "substring": lambda s, t, p, n: substring(s, p, n),
    "substring_to_end": lambda s, t, p, n: substring(s, p),
    "trim": lambda s, t, p, n: trim(s),
    "ltrim": lambda s, t, p, n: ltrim(s),
    "rtrim": lambda s, t, p, n: rtrim(s),
    "concat": lambda s, t, p, n: concat(s, "-", t),
    "replace": lambda s, t, p, n: replace(s, t, "<>"),
    "position": lambda s, t, p, n: position(t, s),
    "like": lambda s, t, p, n: s.like(t),
    "like_constant": lambda s, t, p, n: s.like("a%_"),
    "nullif": lambda s, t, p, n: nullif(s, t),
}
KINDS = {"length": int, "position": int, "like": bool, "like_constant": bool}


def test_postgresql_runs_every_case_but_the_case_mapping():
    assert set(ON_POSTGRESQL) == set(CASES) - CASED


def through(provider, e, events, kind):
    """The indices of ``events`` whose ``want`` (null where ``null``) is ``e``'s value on ``provider``."""
    proc = ep.EventProcessor(provider)
    try:
        proc.register_stream("r", {"i": int, "s": str, "t": str, "want": kind, "null": bool})
        same = (e == ep.col("want")) & ~ep.col("null") | e.is_null() & ep.col("null")
        proc.create_query("q", ep.Stream("r").filter(same))
        found = []
        proc.add_output_processor("q", lambda r: found.append(r["i"]))
        proc.push_events("r", [(event, 1) for event in events])
    finally:
        proc.close()
    return found


@pytest.mark.database
@pytest.mark.parametrize("name", sorted(ON_POSTGRESQL))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=rows_of(NO_NUL), p=POSITIONS, n=COUNTS)
def test_postgresql_gives_the_native_engines_values(postgres_url, name, rows, p, n):
    kind = KINDS.get(name, str)
    e = ON_POSTGRESQL[name](nullif(ep.col("s"), NULL["s"]), nullif(ep.col("t"), NULL["t"]), p, n)
    wanted = on_rows(e, rows)
    events = [{"i": i, "s": NULL["s"] if r["s"] is None else r["s"], "t": NULL["t"] if r["t"] is None else r["t"],
               "want": kind() if w is None else w, "null": w is None} for i, (r, w) in enumerate(zip(rows, wanted))]
    assert through("native", e, events, kind) == list(range(len(rows))), repr(e)
    on_postgresql = through(postgres_url, e, events, kind)
    assert on_postgresql == list(range(len(rows))), (
        f"{e!r} on PostgreSQL differs from the native engine on "
        f"{[(events[i]['s'], events[i]['t'], wanted[i]) for i in range(len(rows)) if i not in on_postgresql]}")


def nested_texts(depth: int) -> st.SearchStrategy:
    """Text expressions of the string functions nested ``depth`` deep over the two nullable fields
    and constants: each function's SQL must bind its arguments' values in their order."""
    leaf = st.one_of(st.sampled_from([nullif(ep.col("s"), NULL["s"]), nullif(ep.col("t"), NULL["t"])]),
                     st.builds(lit, NO_NUL))
    if depth == 0:
        return leaf
    inner = nested_texts(depth - 1)
    return st.one_of(leaf, st.builds(concat, inner, inner), st.builds(replace, inner, inner, inner),
                     st.builds(substring, inner, POSITIONS, COUNTS), st.builds(trim, inner),
                     st.builds(ltrim, inner), st.builds(rtrim, inner), st.builds(nullif, inner, inner))


NESTED = st.one_of(st.tuples(st.just(str), nested_texts(2)),
                   st.tuples(st.just(int), st.builds(length, nested_texts(2))),
                   st.tuples(st.just(int), st.builds(position, nested_texts(1), nested_texts(1))),
                   st.tuples(st.just(bool), st.builds(lambda a, b: a.like(b), nested_texts(1), nested_texts(1))))


@pytest.mark.database
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=rows_of(NO_NUL), nested=NESTED)
def test_postgresql_and_duckdb_give_the_native_values_of_nested_string_functions(postgres_url, rows, nested):
    kind, e = nested
    wanted = on_rows(e, rows)
    events = [{"i": i, "s": NULL["s"] if r["s"] is None else r["s"], "t": NULL["t"] if r["t"] is None else r["t"],
               "want": kind() if w is None else w, "null": w is None} for i, (r, w) in enumerate(zip(rows, wanted))]
    assert through("native", e, events, kind) == list(range(len(rows))), repr(e)
    for provider in ("duckdb", postgres_url):
        found = through(provider, e, events, kind)
        assert found == list(range(len(rows))), (
            f"{e!r} on {provider} differs from the native engine on "
            f"{[(events[i]['s'], events[i]['t'], wanted[i]) for i in range(len(rows)) if i not in found]}")


SURROGATE = "UTF-8 cannot encode its lone surrogate '\\\\ud800'"
NUL = "PostgreSQL text cannot hold a NUL character"


@pytest.mark.parametrize("provider, text, why", [
    pytest.param("sqlite", "a\ud800", SURROGATE, id="sqlite-surrogate"),
    pytest.param("duckdb", "a\ud800", SURROGATE, id="duckdb-surrogate"),
    pytest.param("postgresql", "a\ud800", SURROGATE, marks=pytest.mark.database, id="postgresql-surrogate"),
    pytest.param("postgresql", "a\x00b", NUL, marks=pytest.mark.database, id="postgresql-nul")],
    indirect=["provider"])
def test_a_database_refuses_text_it_cannot_store_before_anything_changes(provider, text, why):
    """A Python str may hold a lone surrogate (no database stores one: UTF-8 has none) or a NUL
    (PostgreSQL's text cannot): an event holding one is refused at the push (none of its call
    processed, the event time unmoved), a constant holding one when the query is created. The
    driver failed at the insert instead, after the event time moved; DuckDB's transaction stayed
    aborted, so every later push and even close failed."""
    name = provider if provider in ("sqlite", "duckdb") else "postgresql"
    proc = ep.EventProcessor(provider)
    try:
        proc.register_stream("s", {"id": str})
        proc.create_query("q", ep.Stream("s", window=ep.Tumbling(10)).aggregate({"n": "count"}))
        rows = []
        proc.add_output_processor("q", rows.append)
        with pytest.raises(ep.SchemaError, match=f"event 1: stream 's': field 'id' holds text the {name} provider "
                                                 f"cannot store \\({why}\\); no event of this call was processed"):
            proc.push_events("s", [({"id": "abc"}, 1), ({"id": text}, 25)])
        proc.push_events("s", [({"id": "abc"}, 2), ({"id": "x"}, 12)])
        with pytest.raises(Unsupported, match=f"cannot run on the {name} provider: {why}"):
            proc.create_query("bad", ep.Stream("s").filter(ep.col("id") == text))
        proc.push_event("s", {"id": "y"}, 30)
    finally:
        proc.close()
    assert [r["n"] for r in rows] == [1, 1, 1], rows       # the window [0, 10) was not closed by ts 25


def database(url, name, options):
    """A new database ``name`` (made with ``options``) on the server of ``url``: its URL."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE template0 {options}")
    return url.replace("/postgres?", f"/{name}?")


@pytest.mark.database
@pytest.mark.parametrize("name, predicate", [("lt", ep.col("id") < "B"), ("gt", ep.col("id") > "Z"),
                                             ("lt_of_a_function", trim(ep.col("id")) < "B"),
                                             ("case_of_constants", when(ep.col("id") == "abc", "a").otherwise("B") < "b")])
def test_postgresql_compares_text_by_code_point_whatever_the_databases_collation(postgres_url, name, predicate):
    """Python compares code points ('B' < 'Z' < 'a'); ICU's English collation, like most databases'
    own (en_US), puts 'a' before 'B': the provider's text columns are in the "C" collation."""
    icu = database(postgres_url, f"strings_icu_{name}",
                   "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
    assert matching(icu, predicate) == matching("native", predicate)


@pytest.mark.database
def test_postgresql_takes_min_and_max_of_text_by_code_point_whatever_the_databases_collation(postgres_url):
    icu = database(postgres_url, "strings_icu_min_max", "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
    found = {}
    for provider in ("native", icu):
        proc = ep.EventProcessor(provider)
        try:
            proc.register_stream("s", {"id": str})
            proc.create_query("q", ep.Stream("s", window=ep.Tumbling(10)).aggregate({"lo": ("min", "id"),
                                                                                       "hi": ("max", "id")}))
            found[provider] = []
            proc.add_output_processor("q", found[provider].append)
            proc.push_events("s", [({"id": text}, 1) for text in EVENTS + ["B", "a"]])
        finally:
            proc.close()
    assert found[icu] == found["native"] == [{"window_start": 0, "window_end": 10, "lo": "", "hi": "ÉTÉ"}]


@pytest.mark.database
def test_postgresql_refuses_a_database_or_connection_not_in_utf8(postgres_url):
    """In SQL_ASCII CHAR_LENGTH('é') is 2 and LIKE's '_' matches a byte; in LATIN1 an emoji cannot be
    stored: the provider refuses such a database (or connection) when it is opened."""
    import psycopg

    ascii_ = database(postgres_url, "strings_ascii", "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'")
    with pytest.raises(ValueError, match="needs a UTF8 database and connection: this server_encoding is SQL_ASCII"):
        ep.EventProcessor(ascii_)
    with psycopg.connect(postgres_url) as conn:
        conn.execute("SET client_encoding TO 'LATIN1'")
        with pytest.raises(ValueError, match="this client_encoding is LATIN1"):
            ep.EventProcessor(conn)

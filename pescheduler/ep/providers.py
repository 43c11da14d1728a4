"""The databases behind the SQL bridge: how to open each, and the SQL that differs between them.

``open_provider(provider)`` takes what ``EventProcessor(provider=...)`` was
given and returns ``(connection, dialect, owned)``:

* ``"sqlite"``: the standard library's ``sqlite3``, in memory (the embedded
  database, as H2 was for JEPC);
* ``"duckdb"``: an in-memory DuckDB (the ``duckdb`` package);
* ``"postgresql://..."`` / ``"postgres://..."``: PostgreSQL through psycopg 3;
* an open DB-API 2.0 connection: used as it is (and not closed by us); the
  dialect follows the driver's module (sqlite3, duckdb, psycopg), else the
  standard SQL of :class:`Dialect` with the driver's ``paramstyle``.

Everything else the bridge writes is standard SQL; a dialect only says how
to write a placeholder, a column type, true division, Python's floor modulo,
and an exact integer ``SUM``.
"""

from __future__ import annotations

import sys
from typing import Any

_MARKS = {"qmark": "?", "format": "%s", "pyformat": "%s", "numeric": None, "named": None}


class Dialect:
    """Standard SQL; subclasses change what their database spells otherwise."""

    name = "sql"
    mark = "?"
    types = {int: "BIGINT", float: "DOUBLE PRECISION", str: "TEXT", bool: "BOOLEAN"}
    real_type = "DOUBLE PRECISION"

    def __init__(self, mark: str | None = None) -> None:
        if mark is not None:
            self.mark = mark

    def param(self, value: Any = None) -> str:
        """The placeholder of a bound value; a constant this database cannot store is refused here,
        when its query is created (bound at a batch, it would fail there, leaving the batch half done)."""
        if type(value) is str and (not value.isascii() or "\x00" in value):
            why = self.unstorable(value)
            if why is not None:
                from ..strings import Unsupported

                raise Unsupported(f"the constant {value!r} cannot run on the {self.name} provider: {why}; "
                                  f"use the native provider")
        return self.mark

    def unstorable(self, text: str) -> str | None:
        """Why this database cannot store ``text``, or None. None stores a lone surrogate (a ``str``
        may hold one; UTF-8 cannot encode it): the driver fails at the insert, DuckDB's transaction
        is then aborted for good. Only called for text that is not all ASCII or holds a NUL."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"UTF-8 cannot encode its lone surrogate {text[exc.start]!r}"
        return None

    def real(self, sql: str) -> str:
        return f"CAST({sql} AS {self.real_type})"

    def floor_mod(self, a: str, b: str) -> str:
        """Python's ``a % b`` (the sign of ``b``): ``a`` written once, then ``b`` three times."""
        return f"MOD(MOD({a}, {b}) + {b}, {b})"

    def int_sum(self, sql: str, over: str = "") -> str:
        """``SUM`` of an integer column as an integer (PostgreSQL widens it to numeric);
        ``over``: a window clause."""
        return f"CAST(SUM({sql}){over} AS BIGINT)"

    def collection(self, name: str, value: str, order: str, q: float | None) -> str | None:
        """The SQL of collection aggregate ``name`` over column ``value`` in a ``GROUP BY`` (``order``:
        the columns of event-time then arrival order; ``q``: a percentile's fraction, a checked float),
        or None where this database has no form of it: the window's rows are then folded in Python.
        Standard SQL has ``COUNT(DISTINCT)`` (a stream's schema refuses nulls, so none is left out)."""
        return f"COUNT(DISTINCT {value})" if name == "count_distinct" else None

    def check(self, connection: Any) -> None:
        """Raise ValueError if ``connection``'s database would give other answers than the native
        engine whatever SQL is written for it (an encoding that is not Unicode's)."""

    def cursor(self, connection: Any) -> Any:
        return connection.cursor()

    def begin(self, cursor: Any) -> None:
        """Start the transaction one pushed batch runs in (DB-API drivers start one implicitly)."""

    def insert(self, cursor: Any, table: str, columns: list[str], rows: list[tuple]) -> None:
        """Insert ``rows`` (values bound): one statement for one row, ``executemany`` for more."""
        marks = ", ".join([self.param()] * len(columns))
        if len(rows) == 1:
            cursor.execute(f"INSERT INTO {table} VALUES ({marks})", rows[0])
        else:
            cursor.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


class SQLite(Dialect):
    name = "sqlite"
    types = {int: "INTEGER", float: "REAL", str: "TEXT", bool: "INTEGER"}
    real_type = "REAL"

    def floor_mod(self, a: str, b: str) -> str:
        return f"((({a}) % ({b})) + ({b})) % ({b})"

    def int_sum(self, sql: str, over: str = "") -> str:
        return f"SUM({sql}){over}"


class DuckDB(Dialect):
    name = "duckdb"
    types = {int: "BIGINT", float: "DOUBLE", str: "VARCHAR", bool: "BOOLEAN"}
    real_type = "DOUBLE"

    def int_sum(self, sql: str, over: str = "") -> str:
        return f"SUM({sql}){over}"

    def collection(self, name: str, value: str, order: str, q: float | None) -> str | None:
        """Also ``quantile_cont`` (linear between ranks, as the native ``percentile``) and ``first``/
        ``last`` with an ``ORDER BY`` of their own."""
        forms = {"percentile": f"QUANTILE_CONT({value}, {q!r})", "first": f"FIRST({value} ORDER BY {order})",
                 "last": f"LAST({value} ORDER BY {order})"}
        return forms.get(name) or super().collection(name, value, order, q)

    def cursor(self, connection: Any) -> Any:
        return connection        # a DuckDB cursor is a connection of its own, with its own transactions

    def begin(self, cursor: Any) -> None:
        cursor.execute("BEGIN TRANSACTION")     # DuckDB autocommits each statement otherwise

    def insert(self, cursor: Any, table: str, columns: list[str], rows: list[tuple]) -> None:
        """A batch as an Arrow table DuckDB scans in place: ``executemany`` runs one statement
        per row (about 5 ms each), this one statement per batch."""
        try:
            import pyarrow as pa
        except ImportError:                     # (pescheduler[ep-databases] brings it)
            pa = None
        if len(rows) < 8 or pa is None:
            return super().insert(cursor, table, columns, rows)

        data = pa.Table.from_arrays([pa.array(list(c)) for c in zip(*rows)], names=columns)
        cursor.from_arrow(data).insert_into(table)     # one call (register/INSERT/unregister were three)


class PostgreSQL(Dialect):
    name = "postgresql"
    mark = "%s"
    types = {**Dialect.types, str: 'TEXT COLLATE "C"'}
    """Text columns in the ``"C"`` collation: compared, ordered, ``MIN``/``MAX``-ed by code point (UTF-8's
    bytes), as Python compares ``str``; the database's own collation (``en_US``, ICU's) puts ``'a'``
    before ``'B'``. An expression over such a column takes its collation, a text constant has it
    (:meth:`param`)."""

    def check(self, connection: Any) -> None:
        """A UTF8 database and connection: in ``SQL_ASCII`` ``CHAR_LENGTH('é')`` is 2 and ``_`` matches
        a byte; in ``LATIN1`` an emoji cannot be stored."""
        status = (getattr(getattr(connection, "info", None), "parameter_status", None)     # psycopg 3
                  or getattr(connection, "get_parameter_status", None))                   # psycopg2
        if status is None:
            return
        for which in ("server_encoding", "client_encoding"):
            encoding = status(which)
            if encoding is not None and encoding.upper() not in ("UTF8", "UTF-8", "UNICODE"):
                raise ValueError(
                    f"the postgresql provider needs a UTF8 database and connection: this {which} is "
                    f"{encoding} (lengths and positions would count bytes, or text outside its characters "
                    f"could not be stored); use a database made with ENCODING 'UTF8' (and client_encoding UTF8)")

    def param(self, value: Any = None) -> str:
        """A text constant typed ``text`` (psycopg binds a ``str`` untyped: ``%s IS NULL`` could not
        determine its type) and in the ``"C"`` collation too (a text that is no column's, a CASE of
        constants, took the database's: ``'a' < 'B'`` in ``en_US``)."""
        mark = super().param(value)
        return f'(CAST({mark} AS TEXT) COLLATE "C")' if type(value) is str else mark

    def unstorable(self, text: str) -> str | None:
        if "\x00" in text:
            return "PostgreSQL text cannot hold a NUL character"
        return super().unstorable(text)

    def collection(self, name: str, value: str, order: str, q: float | None) -> str | None:
        """Also ``PERCENTILE_CONT`` (an ordered-set aggregate, linear between ranks) and ``first``/``last``
        as the first element of an ordered ``ARRAY_AGG`` (PostgreSQL has no ``FIRST``)."""
        backwards = ", ".join(f"{c} DESC" for c in order.split(", "))
        forms = {"percentile": f"PERCENTILE_CONT({q!r}) WITHIN GROUP (ORDER BY {value})",
                 "first": f"(ARRAY_AGG({value} ORDER BY {order}))[1]",
                 "last": f"(ARRAY_AGG({value} ORDER BY {backwards}))[1]"}
        return forms.get(name) or super().collection(name, value, order, q)


def open_provider(provider: Any) -> tuple[Any, Dialect, bool]:
    """``(connection, dialect, owned)`` for ``provider`` (see the module docstring)."""
    if isinstance(provider, str):
        if provider == "sqlite":
            import sqlite3

            return sqlite3.connect(":memory:", check_same_thread=False), SQLite(), True
        if provider == "duckdb":
            import duckdb

            return duckdb.connect(":memory:"), DuckDB(), True
        if provider.startswith(("postgresql://", "postgres://")):
            import psycopg

            connection = psycopg.connect(provider)
            try:
                PostgreSQL().check(connection)
            except ValueError:
                connection.close()
                raise
            return connection, PostgreSQL(), True
        raise ValueError(f"unknown provider {provider!r}: use 'native', 'sqlite', 'duckdb', a URL "
                         f"'postgresql://user@host:port/db', or an open DB-API 2.0 connection")
    if not callable(getattr(provider, "cursor", None)) or not callable(getattr(provider, "commit", None)):
        raise TypeError(f"provider {provider!r} is not a DB-API 2.0 connection (it has no cursor() "
                        f"and commit())")
    dialect = dialect_of(provider)
    dialect.check(provider)
    return provider, dialect, False


def dialect_of(connection: Any) -> Dialect:
    """The dialect of an open connection, from its driver's module."""
    module = type(connection).__module__.split(".")[0]
    if module == "sqlite3":
        return SQLite()
    if module in ("duckdb", "_duckdb"):
        return DuckDB()
    if module == "psycopg" or module == "psycopg2":
        return PostgreSQL()
    style = getattr(sys.modules.get(module), "paramstyle", "qmark")
    mark = _MARKS.get(style)
    if mark is None:
        raise ValueError(f"DB-API driver {module!r} uses paramstyle {style!r}; the bridge binds "
                         f"parameters as qmark (?) or format (%s)")
    return Dialect(mark)

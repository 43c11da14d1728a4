"""The SQL bridge: ``pescheduler.ep`` queries run by a standard database (JEPC's design).

As in "Event Processing on your own Database" (BTW 2013), each query
definition becomes SQL over tables the bridge creates (temporary tables, so
nothing outlives the connection's session):

* every stream has a *batch table*: a pushed event (or a pushed batch) is
  inserted there, the queries reading the stream run over it, then it is
  emptied;
* every time window of a query is a *window table*: the events that enter it
  are inserted from the batch table, and those that can reach no window any
  more are purged by the watermark (the freshest event's time minus the
  stream's ``max_delay``);
* filters, aggregates (``COUNT``, ``SUM``, ``MIN``, ``MAX``, and sums of
  squares: ``avg``, ``var`` and ``stddev`` are derived from those as the
  native engine derives them, so results are equal to the last bit on
  integers) and correlations (a join of the batch table with the other
  side's window table) are generated SQL;
* a pattern's *symbol stream* is computed in the database (one boolean
  column per symbol: the parts of its predicate that read only the event)
  and fed to the NFA of ``operators/pattern.py``, which applies what reads
  the run's measures. Same automaton, same semantics as the native engine.

*When* things happen (which events are late, when a window fires, in which
order results come out) is decided here exactly as the native operators
decide it, so both give the same results in the same order; *what* comes out
is computed by the database.

Safety: every value (event fields, literals of expressions, window bounds)
is a bound parameter; table names are generated; field names are checked to
be identifiers and prefixed (``f_<name>``), so no user text is ever SQL.
Predicates must be expressions (``ep.col``...): a Python function cannot run
in a database, and is refused at ``create_query`` saying how to write it.

Session windows are computed with ``LAG`` (a new session where the gap to
the previous event of the key is at least ``gap``) and a running ``SUM`` of
those starts; count windows with ``ROW_NUMBER`` and a ``ROWS`` frame of
``count`` rows (window functions: SQLite 3.28+, DuckDB, PostgreSQL 11+).
Plug-in aggregates over time windows run in Python over the window table's
rows, as do the collection aggregates where the database has no form of them
(``providers.Dialect.collection``): ``count_distinct`` is SQL everywhere,
``percentile`` and ``first``/``last`` on DuckDB and PostgreSQL, in the ``GROUP BY``
of tumbling, sliding and session windows (a percentile's fraction, a checked
float, is the one literal written into SQL); over count and per-event windows
(window functions) and for the sketches and ``top_k`` the fold stays.
A stream correlated with itself is processed as the left side, then
as the right. Sharing across queries (the paper's Count parallel queries):
per-event windows of one stream, key and filters share one table and one
statement; filters ``expression == literal`` of one expression are one join
with a table of their literals. ``MATCH_RECOGNIZE`` is in none of SQLite,
DuckDB and PostgreSQL: patterns always take the symbol-stream + NFA route.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..aggregates import parse_request
from ..operator import MAX_WATERMARK, MIN_WATERMARK, Emitter
from ..operators.ep_pattern import pattern_functions
from .api import (Aggregate, Correlate, CountWindow, Definition, EventProcessor, Pattern, Session, Sliding,
                  Tumbling, _span, engine, engine_for)
from ..joinkeys import equi_keys
from .predicates import IDENTIFIER, Col, Expr, conjuncts, lift, to_sql
from .providers import open_provider
from .schema import TS_FIELD, Schema, SchemaError

_TABLES = itertools.count(1)
LO = type("LO", (), {"__repr__": lambda self: "LO"})()
"""A parameter standing for the first sequence number of the batch being processed."""
KEEP = 1_000                  # batch tables are emptied once they hold this many rows
PURGE = 1_000                 # count-window tables are purged once this many rows may have come
_INT64 = (-(2**63), 2**63 - 1)
BATCH = 10_000                # as the native engine's source driver: a push is cut into batches of this
BASE = ("count", "sum", "sumsq", "min", "max")
DERIVED = {"avg": ("sum", "count"), "var": ("sum", "sumsq", "count"), "stddev": ("sum", "sumsq", "count")}


def _bound(v: int) -> int:
    """A watermark bound as a 64-bit parameter (Python's ints are wider than a BIGINT)."""
    return min(max(v, _INT64[0]), _INT64[1])


def column(name: str) -> str:
    return f"f_{name}"


def _lambda_error(query_id: Any, what: str, example: str) -> TypeError:
    return TypeError(f"query {query_id!r}: {what} is a Python function, which a database cannot run; "
                     f"write it as an expression, e.g. {example}")


@dataclass
class _SQLStream:
    schema: Schema
    max_delay: int
    table: str
    max_ts: int = MIN_WATERMARK
    wm: int = MIN_WATERMARK
    seq: int = 0
    emptied: int = 0                                  # the batch table holds rows after this seq
    batch: dict = field(default_factory=dict)         # seq -> event of the batch being processed


@engine("sql")
class SQLProcessor(EventProcessor):
    """Queries as SQL on a database; see the module docstring and :class:`EventProcessor`."""

    def __init__(self, provider: Any = "sqlite", share: bool = True) -> None:
        super().__init__(provider)
        self.conn, self.dialect, self._owned = open_provider(provider)
        self.cur = self.dialect.cursor(self.conn)
        self._streams: dict[str, _SQLStream] = {}
        self._runners: dict[Any, "_Query"] = {}
        self._lo = 0
        self._combined: dict[str, tuple] = {}     # stream -> (filter queries, statements)
        self._symbols: dict[str, tuple] = {}      # stream -> (pattern queries, SQL, params)
        self._lookups: dict[str, list] = {}       # batch table -> literal tables of its filters
        from pescheduler.operators.ep_io import OutputProcessors

        self._output = OutputProcessors(self._processors, tagged=True)   # built once: an operator's
        # construction checks its parameters (inspect), too slow for every batch of every query
        self._output.whole_from = self._whole_from     # mid-stream queries: whole windows only

    # -- SQL -----------------------------------------------------------------------------------
    def sql(self, text: str, params: list | tuple = ()) -> list:
        self.cur.execute(text, tuple(self._lo if v is LO else v for v in params))
        return self.cur.fetchall() if self.cur.description is not None else []

    def ddl(self, text: str) -> None:
        self.cur.execute(text)
        self.conn.commit()

    def p(self) -> str:
        return self.dialect.param()

    # -- streams -------------------------------------------------------------------------------
    def register_stream(self, name: str, schema: Mapping[str, Any], max_delay: Any = 0) -> None:
        from pescheduler.operators.ep_io import PushedSource

        self._check_new_stream(name)
        checked = Schema(name, schema)
        bad = [f for f in checked.fields if not IDENTIFIER.match(f)]
        if bad:
            raise ValueError(f"stream {name!r}: field {bad[0]!r} is not an identifier (letters, digits, _), "
                             f"which a database column needs")
        table = f"ep_{next(_TABLES)}_batch"
        cols = "".join(f", {column(f)} {self.dialect.types[t]}" for f, t in checked.fields.items())
        self.ddl(f"CREATE TEMPORARY TABLE {table} (seq BIGINT, ts BIGINT{cols})")
        self._streams[name] = _SQLStream(checked, PushedSource(max_delay=max_delay).max_delay, table)

    def remove_stream(self, name: str) -> None:
        state = self._check_unread(name)
        if not self._closed:
            self._drop_lookups(name)
            self.ddl(f"DROP TABLE {state.table}")
        self._combined.pop(name, None)
        self._symbols.pop(name, None)
        del self._streams[name]

    # -- queries -------------------------------------------------------------------------------
    def create_query(self, query_id: Any, definition: Any) -> None:
        definition = self._new_query(query_id, definition)
        t, window = definition.terminal, definition.stream.window
        if isinstance(t, Aggregate):
            if window is None:
                raise ValueError(f"query {query_id!r}: an aggregate needs a window on its stream, "
                                 f"e.g. ep.Stream({definition.stream.name!r}, window=ep.Tumbling('1s'))")
            if isinstance(window, Sliding) and window.slide == "event":
                kind = _OverAggregate
            elif isinstance(window, (Tumbling, Sliding)):
                kind = _WindowAggregate
            elif isinstance(window, Session):
                kind = _SessionAggregate
            else:
                kind = _CountAggregate
        elif isinstance(t, Correlate):
            kind = _Correlate
        elif isinstance(t, Pattern):
            kind = _Pattern
        else:
            kind = _Filter
        runner = next((r for r in self._runners.values() if r.joins(query_id, definition)), None)
        if runner is None:
            runner = kind(self, query_id, definition)  # checks and compiles; creates its tables last
        self._processors[query_id] = []
        self._queries[query_id] = definition
        self._runners[query_id] = runner
        newest = self._streams[definition.stream.name].max_ts
        self._note_whole_from(query_id, definition, None if newest == MIN_WATERMARK else newest)

    def remove_query(self, query_id: Any) -> None:
        self._known_query(query_id)
        runner = self._runners.pop(query_id)
        if runner.leave(query_id) and not self._closed:   # closed: its tables are gone already
            runner.drop()
        del self._queries[query_id], self._processors[query_id]
        self._whole_from.pop(query_id, None)

    def late(self, query_id: Any) -> list:
        self._known_query(query_id)
        return list(self._runners[query_id].late)

    # -- events --------------------------------------------------------------------------------
    def _push(self, stream: str, events: list[dict]) -> None:
        self._refuse_unstorable(stream, events)
        for i in range(0, len(events), BATCH):
            self._batch(stream, events[i:i + BATCH])

    def _refuse_unstorable(self, stream: str, events: list[dict]) -> None:
        """Text the database cannot store (:meth:`Dialect.unstorable`: a lone surrogate; a NUL on
        PostgreSQL) refused before anything changes: the driver would fail at the insert, after the
        batch's sequence numbers and event time moved (and DuckDB's transaction would stay aborted).
        A field's texts are checked joined (loops in C: about a third of the time of a Python loop per
        value), then one by one only to name the event."""
        for f, t in self._streams[stream].schema.fields.items():
            if t is not str:
                continue
            joined = "".join([e[f] for e in events])
            if (joined.isascii() and "\x00" not in joined) or self.dialect.unstorable(joined) is None:
                continue
            for i, e in enumerate(events):
                why = self.dialect.unstorable(e[f])
                if why is not None:
                    where = f"event {i}: " if len(events) > 1 else ""
                    raise SchemaError(f"{where}stream {stream!r}: field {f!r} holds text the {self.dialect.name} "
                                      f"provider cannot store ({why}); no event of this call was processed "
                                      f"(the native provider takes it)")

    def _batch(self, stream: str, events: list[dict]) -> None:
        """Insert, run every query reading ``stream``, advance the watermark, purge: one transaction."""
        state = self._streams[stream]
        if not events:
            return
        fields = list(state.schema.fields)
        rows, batch = [], {}
        for e in events:
            state.seq += 1
            batch[state.seq] = e
            rows.append((state.seq, e[TS_FIELD], *(e[f] for f in fields)))
            if e[TS_FIELD] > state.max_ts:
                state.max_ts = e[TS_FIELD]
        readers = self._readers(stream)
        filters = [r for r in readers if type(r) is _Filter]
        key = tuple(id(r) for r in filters)
        if len(filters) > 1 and self._combined.get(stream, (None,))[0] != key:   # DDL: before the batch
            self._drop_lookups(stream)
            self._combined[stream] = (key, self._filter_statements(state, filters))
        self.dialect.begin(self.cur)
        if state.seq - len(rows) - state.emptied >= KEEP:   # rows of earlier batches: no query reads them
            self.sql(f"DELETE FROM {state.table}")
            state.emptied = state.seq - len(rows)
        self._lo = state.seq - len(rows) + 1
        self.dialect.insert(self.cur, state.table, ["seq", "ts", *map(column, fields)], rows)
        state.batch = batch
        if len(filters) > 1:
            self._filter_all(stream, state, filters)
        patterns = [r for r in readers if type(r) is _Pattern]
        if len(patterns) > 1:
            self._symbols_all(stream, state, patterns)
        together = (_Filter,) * (len(filters) > 1) + (_Pattern,) * (len(patterns) > 1)
        for r in readers:
            if type(r) not in together:
                r.on_batch(stream, state)
        wm = state.max_ts - state.max_delay - 1
        if state.max_ts != MIN_WATERMARK and wm > state.wm:
            state.wm = wm
            for r in readers:
                r.advance()
        state.batch = {}
        self.conn.commit()

    def _readers(self, stream: str | None) -> list:
        """The runners reading ``stream`` (every runner for None), each once (some serve many queries)."""
        found = {id(r): r for r in self._runners.values() if stream is None or stream in r.streams}
        return list(found.values())

    def _filter_all(self, stream: str, state: _SQLStream, filters: list) -> None:
        """Every filter query of ``stream`` in few statements.

        Queries whose one predicate is ``expression == literal`` with the same
        expression (the JEPC filters: ``a - b = i``, i = 1..Count) become one
        join of the batch with a table of their literals: the database computes
        the expression once per event and finds the queries by equality (one
        small statement; 80 ``CASE`` columns with 160 parameters cost DuckDB
        hundreds of ms to bind). The others share one statement with a column
        of truth per query.
        """
        hits: dict[int, list] = {id(r): [] for r in filters}
        for text, params, owners in self._combined[stream][1]:
            rows = self.sql(text, params)
            if owners is None:                       # (seq, query index) per hit, by seq
                for seq, i in rows:
                    hits[id(filters[i])].append(state.batch[seq])
            else:
                for row in rows:
                    for i, r in enumerate(owners, start=1):
                        if row[i]:
                            hits[id(r)].append(state.batch[row[0]])
        for r in filters:
            self.emit(r.query_id, hits[id(r)])

    def _symbols_all(self, stream: str, state: _SQLStream, patterns: list) -> None:
        """The symbol streams of every pattern query of ``stream`` in one statement: per query a
        column saying whether the event passed its filters, then its symbol columns."""
        key = tuple(id(r) for r in patterns)
        cached = self._symbols.get(stream)
        if cached is None or cached[0] != key:
            cols = ", ".join(f"CASE WHEN {r.where} THEN 1 ELSE 0 END, {r.bits}" for r in patterns)
            cached = self._symbols[stream] = (
                key, f"SELECT seq, {cols} FROM {state.table} n WHERE n.seq >= {self.p()} ORDER BY seq",
                [v for r in patterns for v in (*r.where_params, *r.bit_params)] + [LO])
        rows = self.sql(cached[1], cached[2])
        at = 1
        for r in patterns:
            width = len(r.nfa_symbols)
            r.feed([(row[0], *row[at + 1:at + 1 + width]) for row in rows if row[at]], state)
            at += 1 + width

    def _filter_statements(self, state: _SQLStream, filters: list) -> list:
        """``[(SQL, params, owners)]``: a join with a literal table per shared expression (owners
        None: rows are (seq, index in ``filters``)), one CASE statement for the rest."""
        from ..expr import Binary, Lit

        groups: dict[tuple, list] = {}
        for i, r in enumerate(filters):
            preds = [f.predicate for f in r.d.filters]
            c = preds[0] if len(preds) == 1 else None
            if isinstance(c, Binary) and c.op == "eq":
                e, lit = (c.left, c.right) if isinstance(c.right, Lit) else (c.right, c.left)
                if isinstance(lit, Lit) and not isinstance(e, Lit) and type(lit.value) in (int, str):
                    groups.setdefault((repr(e), type(lit.value)), []).append((i, e, lit.value))
        statements, grouped = [], set()
        for (_, kind), members in groups.items():
            if len(members) < 2:
                continue
            table = f"ep_{next(_TABLES)}_lookup"
            self.ddl(f"CREATE TEMPORARY TABLE {table} (q BIGINT, v {self.dialect.types[kind]})")
            self.dialect.insert(self.cur, table, ["q", "v"], [(i, v) for i, _, v in members])
            self.conn.commit()
            self._lookups.setdefault(state.table, []).append(table)
            params: list = []
            e_sql = filters[members[0][0]].predicate(members[0][1], "filter", "n", params)
            statements.append((f"SELECT n.seq, l.q FROM {state.table} n JOIN {table} l ON {e_sql} = l.v "
                               f"WHERE n.seq >= {self.p()} ORDER BY n.seq, l.q", params + [LO], None))
            grouped.update(i for i, _, _ in members)
        rest = [r for i, r in enumerate(filters) if i not in grouped]
        if rest:
            cols = ", ".join(f"CASE WHEN {r.where} THEN 1 ELSE 0 END" for r in rest)
            statements.append((f"SELECT seq, {cols} FROM {state.table} n WHERE n.seq >= {self.p()} ORDER BY seq",
                               [v for r in rest for v in r.where_params] + [LO], rest))
        return statements

    def _drop_lookups(self, stream: str | None) -> None:
        """Drop the literal tables of ``stream``'s filters (every stream's for None)."""
        tables = [self._streams[stream].table] if stream is not None else list(self._lookups)
        for t in tables:
            for lookup in self._lookups.pop(t, ()):
                self.ddl(f"DROP TABLE {lookup}")

    def _end(self) -> None:
        for name, state in self._streams.items():
            self.dialect.begin(self.cur)
            state.wm = MAX_WATERMARK
            for r in self._readers(name):
                r.advance()
            self.conn.commit()
        if self._owned:
            self.conn.close()
            return
        self._drop_lookups(None)
        for r in self._readers(None):                  # the caller's connection: leave it as it was
            r.drop()
        for state in self._streams.values():
            self.ddl(f"DROP TABLE {state.table}")

    def emit(self, query_id: Any, rows: list) -> None:
        """Hand ``rows`` to the query's output processors (a failing one is dead-lettered)."""
        if rows:
            out = Emitter()
            self._output.process([(query_id, row) for row in rows], out)
            self._dead.extend(out.dead or ())

    def application(self, name: str, sources: Mapping[str, Any]) -> Any:
        """The queries as a deployable ``Application`` (the native operators: see ``native.py``)."""
        twin = engine_for("native")()
        for stream, state in self._streams.items():
            twin.register_stream(stream, dict(state.schema.fields), state.max_delay)
        for query_id, definition in self._queries.items():
            twin.create_query(query_id, definition)
        return twin.application(name, sources)


# -- one query each ------------------------------------------------------------------------------
class _Query:
    """A query's SQL and state on one processor; subclasses per query kind."""

    def __init__(self, proc: SQLProcessor, query_id: Any, d: Definition) -> None:
        self.proc, self.query_id, self.d = proc, query_id, d
        self.streams = d.streams()
        self.late: list = []
        self.tables: list[str] = []
        self.schema = proc._stream(d.stream.name).schema
        self.wm = self._stream_wm()
        params: list = [LO]
        where = [f"n.seq >= {proc.p()}"] + [self.predicate(f.predicate, "filter", "n", params) for f in d.filters]
        self.where = " AND ".join(where)
        self.where_params = params

    def joins(self, query_id: Any, d: Definition) -> bool:
        """Whether this runner takes query ``query_id`` too (runners serving many queries say yes)."""
        return False

    def leave(self, query_id: Any) -> bool:
        """``query_id`` is removed; True when this runner serves no query any more."""
        return True

    def _stream_wm(self) -> int:
        return min(self.proc._streams[s].wm for s in self.streams)

    def predicate(self, pred: Any, what: str, alias: str, params: list,
                  sides: Mapping[str, tuple[str, Schema]] | None = None) -> str:
        """``pred`` (an expression) as SQL over table ``alias``; a Python function is refused."""
        if not isinstance(pred, Expr):
            if callable(pred):
                raise _lambda_error(self.query_id, f"the {what} {pred!r}",
                                    "ep.col('a') - ep.col('b') == 1")
            pred = lift(pred)
        sides = sides or {"event": (alias, self.schema)}
        return to_sql(pred, lambda f: self.column(f, sides), self.proc.dialect, params)

    def column(self, f: Col, sides: Mapping[str, tuple[str, Schema]]) -> str:
        if f.side not in sides:
            raise ValueError(f"query {self.query_id!r}: {f!r} has no meaning here "
                             f"(this expression may read {', '.join(sides)} fields)")
        alias, schema = sides[f.side]
        if f.name == TS_FIELD:
            return f"{alias}.ts"
        if f.name not in schema.fields:
            raise ValueError(f"query {self.query_id!r}: {f!r}: stream {schema.stream!r} has no field "
                             f"{f.name!r}; its schema is {schema.describe()}")
        return f"{alias}.{column(f.name)}"

    def table(self, schema: Schema, extra: str = "") -> str:
        name = f"ep_{next(_TABLES)}_window"
        cols = "".join(f", {column(f)} {self.proc.dialect.types[t]}" for f, t in schema.fields.items())
        self.proc.ddl(f"CREATE TEMPORARY TABLE {name} (seq BIGINT, ts BIGINT{extra}{cols})")
        self.tables.append(name)
        return name

    def drop(self) -> None:
        for t in self.tables:
            self.proc.ddl(f"DROP TABLE {t}")

    def on_batch(self, stream: str, state: _SQLStream) -> None:
        raise NotImplementedError

    def advance(self) -> None:
        wm = self._stream_wm()
        if wm > self.wm:
            self.wm = wm
            self.on_watermark(wm)

    def on_watermark(self, wm: int) -> None:
        pass


class _Filter(_Query):
    """Filters only: the events of the batch table that pass, in push order."""

    def on_batch(self, stream: str, state: _SQLStream) -> None:
        rows = self.proc.sql(f"SELECT seq FROM {state.table} n WHERE {self.where} ORDER BY seq",
                             self.where_params)
        self.proc.emit(self.query_id, [state.batch[s] for (s,) in rows])


class _Aggregates:
    """``{output: (function, field)}`` as SQL over base aggregates, derived as the native plan does."""

    def __init__(self, query_id: Any, spec: Mapping, schema: Schema, dialect: Any, alias: str,
                 grouped: bool = False) -> None:
        self.outputs: list[tuple[str, str, Any]] = []
        self.base: list[tuple[str, str | None]] = []
        self.python: list[tuple[str, Any, str | None]] = []     # plug-in aggregates: run in Python
        self.forms: dict[tuple[str, str], str] = {}             # collection aggregates the database computes
        self.schema, self.dialect, self.alias = schema, dialect, alias
        for out, request in spec.items():
            fn, fld = parse_request(out, request)
            form = self._collection(request, fld) if grouped else None
            if form is not None:
                key = (f"{request[0]}{request[2:]}", fld)
                self.forms[key] = form
                self.outputs.append((out, "sql", key))
                self.base += [key] if key not in self.base else []
                continue
            if not isinstance(fn, str) or fn not in BASE + tuple(DERIVED):
                from ..operators.window import _plugin_aggregates
                from ..aggregates import AggregatePlan

                agg = AggregatePlan(registry=_plugin_aggregates()).lookup(fn)
                if not agg.is_base:
                    raise ValueError(f"query {query_id!r}: aggregate {out!r}: derived plug-in aggregates "
                                     f"run on the native provider; on a database use a base one "
                                     f"(create/update/merge)")
                if agg.needs_field and (not isinstance(fld, str) or fld not in schema.fields):
                    raise ValueError(f"query {query_id!r}: aggregate {out!r}: {fld!r} is not a field of "
                                     f"stream {schema.stream!r} ({schema.describe()})")
                self.python.append((out, agg, fld if agg.needs_field else None))
                self.outputs.append((out, "python", fld))
                continue
            if fn != "count":
                if not isinstance(fld, str) or fld not in schema.fields:
                    raise ValueError(f"query {query_id!r}: aggregate {out!r}: {fld!r} is not a field of "
                                     f"stream {schema.stream!r} ({schema.describe()})")
            else:
                fld = None
            self.outputs.append((out, fn, fld))
            for b in DERIVED.get(fn, (fn,)):
                key = (b, None if b == "count" else fld)
                if key not in self.base:
                    self.base.append(key)
        if ("count", None) not in self.base:       # a row needs one column at least
            self.base.append(("count", None))
        self.sql = ", ".join(self.parts())

    def _collection(self, request: Any, fld: Any) -> str | None:
        """The database's SQL of a collection aggregate (``count_distinct``, ``percentile``, ``first``,
        ``last``: :meth:`Dialect.collection`) in a ``GROUP BY``, or None: folded in Python."""
        if not isinstance(request, (tuple, list)) or not isinstance(request[0], str) \
                or not isinstance(fld, str) or fld not in self.schema.fields:
            return None
        q = float(request[2]) if len(request) == 3 else None     # checked by parse_request
        return self.dialect.collection(request[0], f"{self.alias}.{column(fld)}",
                                       f"{self.alias}.ts, {self.alias}.seq", q)

    def parts(self, over: str = "") -> list[str]:
        """Each base aggregate as SQL; ``over``: a window clause (``OVER (...)``) for each."""
        parts = []
        for fn, fld in self.base:
            if (fn, fld) in self.forms:
                parts.append(self.forms[(fn, fld)])
                continue
            c = f"{self.alias}.{column(fld)}" if fld else None
            integer = fld is not None and self.schema.fields[fld] is int
            if fn == "count":
                parts.append(f"COUNT(*){over}")
            elif fn == "sum":
                parts.append(self.dialect.int_sum(c, over) if integer else f"SUM({c}){over}")
            elif fn == "sumsq":
                parts.append(self.dialect.int_sum(f"{c} * {c}", over) if integer else f"SUM({c} * {c}){over}")
            else:
                parts.append(f"{fn.upper()}({c}){over}")
        return parts

    def fold(self, events: list) -> dict:
        """The plug-in aggregates over ``events`` (a window's, in event-time then arrival order),
        run in Python: ``create``, ``update`` per value, ``result``. A timed aggregate
        (``first``, ``last``) takes the event's position, which orders as its event time does."""
        out = {}
        for name, agg, fld in self.python:
            acc = agg.create()
            for i, e in enumerate(events):
                value = e[fld] if fld is not None else None
                acc = agg.update(acc, (i, value) if agg.timed else value)
            out[name] = agg.result(acc) if agg.result is not None else acc
        return out

    def row(self, values: tuple, python: dict | None = None) -> dict:
        got = dict(zip(self.base, values))
        out = {}
        for name, fn, fld in self.outputs:
            n = got[("count", None)] if ("count", None) in got else None
            if fn == "python":
                out[name] = python[name]
            elif fn == "sql":
                out[name] = got[fld]
            elif fn in BASE:
                out[name] = got[(fn, fld)]
            else:
                total = got[("sum", fld)]
                if fn == "avg":
                    out[name] = total / n
                else:
                    var = max(0.0, got[("sumsq", fld)] / n - (total / n) ** 2)
                    out[name] = var if fn == "var" else var ** 0.5
        return out


class _Windowed(_Query):
    GROUPED = True       # its aggregates are a GROUP BY (not window functions: no collection forms there)

    def __init__(self, proc: SQLProcessor, query_id: Any, d: Definition) -> None:
        super().__init__(proc, query_id, d)
        key = d.stream.key
        if key is not None and (not isinstance(key, str) or key not in self.schema.fields):
            raise ValueError(f"query {query_id!r}: key {key!r} is not a field of stream "
                             f"{self.schema.stream!r} ({self.schema.describe()})")
        self.key = key
        self.kcol = f"q.{column(key)}" if key else None
        self.aggs = _Aggregates(query_id, d.terminal.aggregates, self.schema, proc.dialect, "q", self.GROUPED)

    def result(self, k: Any, ws: int, we: int, values: tuple, python: dict | None = None) -> dict:
        head = {self.key: k} if self.key else {}
        return {**head, "window_start": ws, "window_end": we, **self.aggs.row(values, python)}

    def _events(self, since: int | None = None) -> dict:
        """The window table's events (the fields plug-in aggregates read) per key, in event-time
        then arrival order: ``{key: [(seq, event)]}``; ``since``: only those with ``ts > since``."""
        fields = list(dict.fromkeys([f for _, _, f in self.aggs.python if f is not None]
                                    + ([self.key] if self.key else [])))
        cols = "".join(f", {column(f)}" for f in fields)
        where, params = ("", []) if since is None else (f" WHERE ts > {self.proc.p()}", [_bound(since)])
        per_key: dict = {}
        for row in self.proc.sql(f"SELECT seq, ts{cols} FROM {self.t}{where} ORDER BY ts, seq", params):
            e = dict(zip(fields, row[2:]))
            e[TS_FIELD] = row[1]
            per_key.setdefault(e.get(self.key) if self.key else None, []).append((row[0], e))
        return per_key


class _WindowAggregate(_Windowed):
    """Tumbling or sliding windows: panes of ``slide`` in a window table, fired by the watermark."""

    def __init__(self, proc: SQLProcessor, query_id: Any, d: Definition) -> None:
        super().__init__(proc, query_id, d)
        w = d.stream.window
        self.size = w.span
        self.slide = self.size if isinstance(w, Tumbling) else _span(Sliding(w.slide, w.slide), "slide")
        if self.size <= 0 or self.slide <= 0 or self.size % self.slide:
            raise ValueError(f"query {query_id!r}: window size ({self.size} ms) must be a positive multiple "
                             f"of slide ({self.slide} ms)")
        self.fired_end: int | None = None
        self.panes: set = set()                 # pane starts that may hold rows (a superset)
        if self.wm > MIN_WATERMARK:
            self.fired_end = (self.wm + 1) - (self.wm + 1) % self.slide
        self.t = self.table(self.schema, ", pane BIGINT")
        cols = ", ".join(column(f) for f in self.schema.fields)
        p, dialect = proc.p(), proc.dialect
        pane = f"(n.ts - {dialect.floor_mod('n.ts', p)})"
        self.pane_params = [self.slide] * pane.count(p)
        self.insert = (f"INSERT INTO {self.t} (seq, ts, pane, {cols}) SELECT n.seq, n.ts, {pane}, "
                       + ", ".join(f"n.{column(f)}" for f in self.schema.fields)
                       + f" FROM {{batch}} n WHERE {self.where} AND {pane} > {p}")
        self.late_sql = f"SELECT seq FROM {{batch}} n WHERE {self.where} AND {pane} <= {p} ORDER BY seq"
        group = f"GROUP BY {self.kcol} ORDER BY MIN(q.pane), MIN(q.first)" if self.key else ""
        first = (f", FIRST_VALUE(seq) OVER (PARTITION BY {column(self.key)} ORDER BY pane, seq) AS first"
                 if self.key else "")
        self.fire_sql = (f"SELECT {self.kcol + ', ' if self.key else ''}{self.aggs.sql} FROM "
                         f"(SELECT *{first} FROM {self.t} WHERE pane >= {p} AND pane < {p}) q {group}")

    def on_batch(self, stream: str, state: _SQLStream) -> None:
        lim = self.wm - self.size + 1               # panes starting at or before this are late
        params = [*self.where_params, *self.pane_params, _bound(lim)]
        panes = {e[TS_FIELD] - e[TS_FIELD] % self.slide for e in state.batch.values()}
        if min(panes) <= lim:                      # only then can the database find late ones
            late = self.proc.sql(self.late_sql.format(batch=state.table), params)
            self.late.extend(state.batch[s] for (s,) in late)
        self.panes.update(p for p in panes if p > lim)
        self.proc.sql(self.insert.format(batch=state.table), [*self.pane_params, *params])

    def _python(self, start: int, end: int) -> dict:
        """The plug-in aggregates of window ``[start, end)``, per key with rows in it (a key with rows
        only after ``end`` has no window here: a percentile of no values has no value), in event order."""
        rows = {k: [e for _, e in events if start <= e[TS_FIELD] < end]
                for k, events in self._events(start - 1).items()}
        return {k: self.aggs.fold(events) for k, events in rows.items() if events}

    def on_watermark(self, wm: int) -> None:
        starts = sorted(self.panes)
        if starts:
            self._fire(starts, wm + 1)
            bound = wm - self.size + 1
            if starts[0] <= bound:
                self.proc.sql(f"DELETE FROM {self.t} WHERE pane <= {self.proc.p()}", [_bound(bound)])
                self.panes = {p for p in starts if p > bound}
        self.fired_end = (wm + 1) - (wm + 1) % self.slide

    def _fire(self, starts: list, last_end: int) -> None:
        """Every window ending in ``(fired_end, last_end]`` with data, by end (``Window._fire``)."""
        from bisect import bisect_left

        size, slide = self.size, self.slide
        end = starts[0] + slide
        if self.fired_end is not None:
            end = max(end, self.fired_end + slide)
        rows = []
        while end <= last_end:
            lo = bisect_left(starts, end - size)
            if lo == len(starts):
                break
            if starts[lo] >= end:
                end = starts[lo] + slide
                continue
            python = self._python(end - size, end) if self.aggs.python else None
            for values in self.proc.sql(self.fire_sql, [end - size, end]):
                k, values = (values[0], values[1:]) if self.key else (None, values)
                rows.append(self.result(k, end - size, end, values, python and python[k]))
            end += slide
        self.proc.emit(self.query_id, rows)


class _Kept(_Windowed):
    """A window table of the query's on-time events (late ones reported): per-event windows,
    sessions, count windows."""

    def __init__(self, proc: SQLProcessor, query_id: Any, d: Definition) -> None:
        super().__init__(proc, query_id, d)
        self.t = self.table(self.schema)
        p = proc.p()
        cols = ", ".join(column(f) for f in self.schema.fields)
        self.insert = (f"INSERT INTO {self.t} (seq, ts, {cols}) SELECT n.seq, n.ts, "
                       + ", ".join(f"n.{column(f)}" for f in self.schema.fields)
                       + f" FROM {{batch}} n WHERE {self.where} AND n.ts > {p}")
        self.late_sql = f"SELECT seq FROM {{batch}} n WHERE {self.where} AND n.ts <= {p} ORDER BY seq"
        self.part = f"PARTITION BY q.{column(self.key)} " if self.key else ""
        self.kcols = f", q.{column(self.key)}" if self.key else ""

    def on_batch(self, stream: str, state: _SQLStream) -> None:
        params = [*self.where_params, _bound(self.wm)]
        if min(e[TS_FIELD] for e in state.batch.values()) <= self.wm:
            self.late.extend(state.batch[s] for (s,) in self.proc.sql(self.late_sql.format(batch=state.table),
                                                                       params))
        self.proc.sql(self.insert.format(batch=state.table), params)


class _OverAggregate(_Kept):
    """``Sliding(size, "event")``: a row per event over its key's ``(ts - size, ts]``.

    One runner serves every such query of a stream with the same key and
    filters, whatever its size (the JEPC aggregation: Count sizes): one window
    table, one insert per batch, and one statement per watermark computing
    every query's aggregates as window functions (``RANGE BETWEEN size - 1
    PRECEDING AND CURRENT ROW``: peers included, as the native engine does).
    A query joins a runner only while it has seen no event (so that no window
    of the newcomer holds events from before it existed).
    """

    GROUPED = False      # window functions (RANGE frames)

    def __init__(self, proc: SQLProcessor, query_id: Any, d: Definition) -> None:
        super().__init__(proc, query_id, d)
        self.members: dict[Any, tuple[int, _Aggregates]] = {}
        self.swept = MIN_WATERMARK
        self.born = proc._streams[d.stream.name].seq
        self._add(query_id, d)

    def joins(self, query_id: Any, d: Definition) -> bool:
        w = d.stream.window
        if not (isinstance(d.terminal, Aggregate) and isinstance(w, Sliding) and w.slide == "event"
                and d.stream.name == self.d.stream.name and d.stream.key == self.key
                and self.proc._streams[d.stream.name].seq == self.born):
            return False
        probe = _Query(self.proc, query_id, d)           # the filters, as SQL: the same ones?
        if (probe.where, probe.where_params) != (self.where, self.where_params):
            return False
        return self._add(query_id, d)

    def _add(self, query_id: Any, d: Definition) -> bool:
        size = d.stream.window.span
        if size <= 0:
            raise ValueError(f"query {query_id!r}: an event window's size must be positive, got {size}")
        aggs = _Aggregates(query_id, d.terminal.aggregates, self.schema, self.proc.dialect, "q")
        self.members[query_id] = (size, aggs)
        self._compile()
        return True

    def leave(self, query_id: Any) -> bool:
        del self.members[query_id]
        if self.members:
            self._compile()
        return not self.members

    def _compile(self) -> None:
        p = self.proc.p()
        self.size = max(size for size, _ in self.members.values())
        part = self.part
        cols = []
        for size, aggs in self.members.values():      # sizes are ints of ours, checked: no user text
            cols += aggs.parts(f" OVER w{size}")
        windows = ", ".join(f"w{size} AS ({part}ORDER BY q.ts RANGE BETWEEN {int(size) - 1} PRECEDING "
                            f"AND CURRENT ROW)" for size in sorted({s for s, _ in self.members.values()}))
        key = f", q.{column(self.key)}" if self.key else ""
        self.fire_sql = (f"SELECT * FROM (SELECT q.seq, q.ts{key}, {', '.join(cols)} FROM {self.t} q "
                         f"WHERE q.ts > {p} WINDOW {windows}) w WHERE w.ts > {p} AND w.ts <= {p}")

    def on_watermark(self, wm: int) -> None:
        raise AssertionError("advance() is overridden")

    def advance(self) -> None:
        wm = self._stream_wm()
        if wm <= self.wm:
            return
        old, self.wm = self.wm, wm
        got = self.proc.sql(self.fire_sql, [_bound(old - self.size), _bound(old), wm])
        # Order as the native engine takes them: by ts, keys in first-arrival order, then arrival.
        n = 3 if self.key else 2
        first: dict = {}
        for row in got:
            k = row[2] if self.key else None
            first[row[1], k] = min(first.get((row[1], k), row[0]), row[0])
        got.sort(key=lambda r: (r[1], first[r[1], r[2] if self.key else None], r[0]))
        at = n
        python = any(aggs.python for _, aggs in self.members.values())
        per_key = self._events(old - self.size) if python and got else {}
        times = {k: [e[TS_FIELD] for _, e in events] for k, events in per_key.items()}
        for query_id, (size, aggs) in self.members.items():
            width = len(aggs.base)
            rows = []
            for row in got:
                k = row[2] if self.key else None
                head = {self.key: k} if self.key else {}
                folded = None
                if aggs.python:                   # plug-in aggregates: in Python over (ts - size, ts]
                    lo, hi = bisect_right(times[k], row[1] - size), bisect_right(times[k], row[1])
                    folded = aggs.fold([e for _, e in per_key[k][lo:hi]])
                rows.append({**head, "window_start": row[1] - size + 1, "window_end": row[1] + 1,
                             **aggs.row(tuple(row[at:at + width]), folded)})
            at += width
            self.proc.emit(query_id, rows)
        if wm - self.swept >= self.size:           # forget what no future window reaches, now and then
            self.swept = wm
            self.proc.sql(f"DELETE FROM {self.t} WHERE ts <= {self.proc.p()}", [_bound(wm - self.size)])


class _SessionAggregate(_Kept):
    """``Session(gap)``: per key, a new session where the gap to the key's previous event (``LAG``)
    is at least ``gap``; a session fires when the watermark reaches its last ms
    (``last ts + gap - 1``), in order of end, start, then the order its key opened a session."""

    def __init__(self, proc: SQLProcessor, query_id: Any, d: Definition) -> None:
        super().__init__(proc, query_id, d)
        from ..timeutil import parse_duration

        self.gap = parse_duration(d.stream.window.gap)
        if self.gap <= 0:
            raise ValueError(f"query {query_id!r}: a session gap must be positive, got {d.stream.window.gap!r}")
        p = proc.p()
        self.opened: dict = {}                 # key -> the order it opened a session (while it has one)
        self.next = 0
        order = "ORDER BY q.ts, q.seq"
        sessions = (f"SELECT q.*, SUM(q.start) OVER ({self.part}{order} ROWS UNBOUNDED PRECEDING) AS sid FROM "
                    f"(SELECT q.*, CASE WHEN q.ts - LAG(q.ts) OVER ({self.part}{order}) < {p} THEN 0 ELSE 1 END "
                    f"AS start FROM {self.t} q) q")
        group = f"q.{column(self.key)}, q.sid" if self.key else "q.sid"
        self.fire_sql = (f"SELECT {'q.' + column(self.key) + ', ' if self.key else ''}MIN(q.ts), MAX(q.ts), "
                         f"{self.aggs.sql} FROM ({sessions}) q GROUP BY {group}")
        self.purge_sql = (f"DELETE FROM {self.t} WHERE seq IN (SELECT q.seq FROM (SELECT q.seq, MAX(q.ts) OVER "
                          f"(PARTITION BY {group}) AS last FROM ({sessions}) q) q WHERE q.last <= {p})")

    def on_batch(self, stream: str, state: _SQLStream) -> None:
        super().on_batch(stream, state)
        if all(e[TS_FIELD] <= self.wm for e in state.batch.values()):
            return
        passed = self.proc.sql(f"SELECT seq FROM {state.table} n WHERE {self.where} AND n.ts > {self.proc.p()} "
                               f"ORDER BY seq", [*self.where_params, _bound(self.wm)])
        for (seq,) in passed:                  # keys that open a session now, in arrival order
            k = state.batch[seq][self.key] if self.key else None
            if k not in self.opened:
                self.opened[k] = self.next
                self.next += 1

    def on_watermark(self, wm: int) -> None:
        if not self.opened:
            return
        got = self.proc.sql(self.fire_sql, [self.gap])
        fired, open_keys = [], set()
        for row in got:
            k, first, last, values = (row[0], row[1], row[2], row[3:]) if self.key else (None, *row[:2], row[2:])
            if last + self.gap - 1 <= wm:
                fired.append((last + self.gap, first, self.opened[k], k, tuple(values)))
            else:
                open_keys.add(k)
        if not fired:
            return
        fired.sort(key=lambda f: f[:3])
        per_key = self._events() if self.aggs.python else None       # plug-in aggregates: in Python
        self.proc.emit(self.query_id, [self.result(k, first, end, values, per_key and self.aggs.fold(
            [e for _, e in per_key[k] if first <= e[TS_FIELD] <= end - self.gap]))
            for end, first, _, k, values in fired])
        self.proc.sql(self.purge_sql, [self.gap, _bound(wm - self.gap + 1)])
        self.opened = {k: n for k, n in self.opened.items() if k in open_keys}


class _CountAggregate(_Kept):
    """``CountWindow(count, slide)``: per key, ``ROW_NUMBER`` in event-time order (equal times in
    arrival order); a window ends at every ``slide``-th row from the ``count``-th, aggregated
    over a frame of ``count`` rows, and comes out when the watermark passes its last row.

    Purge: rows of a key that no window to come reaches go, a multiple of ``slide`` at a time,
    so the numbering of the rows left keeps the windows where they were (the next window's
    ``count`` rows stay). It runs once the table may have grown by :data:`PURGE` rows, so the
    table holds at most about ``count`` rows per key plus that.
    """

    GROUPED = False      # a ROWS frame: window functions

    def __init__(self, proc: SQLProcessor, query_id: Any, d: Definition) -> None:
        super().__init__(proc, query_id, d)
        w = d.stream.window
        count, slide = w.count, w.slide if w.slide is not None else w.count
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (count, slide)) \
                or count % slide:
            raise ValueError(f"query {query_id!r}: a count window's count and slide are positive ints, "
                             f"count a multiple of slide; got count={w.count!r}, slide={w.slide!r}")
        self.count, self.slide = count, slide
        self.taken = self.wm
        self.added = 0                           # rows inserted since the last purge (at most)
        p, mod = proc.p(), proc.dialect.floor_mod
        order = "ORDER BY q.ts, q.seq"
        frame = f"{self.part}{order} ROWS BETWEEN {int(count) - 1} PRECEDING AND CURRENT ROW"
        self.fire_sql = (f"SELECT * FROM (SELECT q.seq, q.ts{self.kcols}, ROW_NUMBER() OVER ({self.part}{order}) "
                         f"AS rn, FIRST_VALUE(q.ts) OVER ({frame}) AS first, "
                         f"{', '.join(self.aggs.parts(f' OVER ({frame})'))} FROM {self.t} q) w "
                         f"WHERE w.ts > {p} AND w.ts <= {p} AND w.rn >= {p} "
                         f"AND {mod(f'w.rn - {p}', p)} = 0 "
                         f"ORDER BY w.ts, w.seq")
        # n rows of a key passed by the watermark: the windows ending at them have fired; the next
        # ends at count + j * slide > n, so its first row is j * slide + 1, and the rows before go.
        self.purge_sql = (f"DELETE FROM {self.t} WHERE seq IN (SELECT w.seq FROM (SELECT q.seq, ROW_NUMBER() "
                          f"OVER ({self.part}{order}) AS rn, SUM(CASE WHEN q.ts <= {p} THEN 1 ELSE 0 END) "
                          f"OVER ({self.part}) AS n FROM {self.t} q) w WHERE w.n >= {p} "
                          f"AND w.rn <= w.n - {p} - {mod(f'w.n - {p}', p)} + {p})")

    def on_batch(self, stream: str, state: _SQLStream) -> None:
        super().on_batch(stream, state)
        self.added += len(state.batch)

    def on_watermark(self, wm: int) -> None:
        got = self.proc.sql(self.fire_sql, [_bound(self.taken), _bound(wm), self.count, self.count,
                                              *[self.slide] * 3])   # floor_mod writes its divisor 3 times
        self.taken = wm
        n = 3 if self.key else 2
        frames = self._frames(got) if self.aggs.python else None
        rows = []
        for row in got:
            k = row[2] if self.key else None
            first, values = row[n + 1], tuple(row[n + 2:])
            rows.append(self.result(k, first, row[1] + 1, values, frames and self.aggs.fold(frames[row[0]])))
        self.proc.emit(self.query_id, rows)
        if self.added >= max(PURGE, self.count):
            self.added = 0
            self.proc.sql(self.purge_sql, [_bound(wm), self.count, self.count, self.count, *[self.slide] * 4])

    def _frames(self, fired: list) -> dict:
        """seq of each fired window's last row -> the ``count`` events of its frame, in order."""
        per_key = self._events()
        where = {seq: (k, i) for k, events in per_key.items() for i, (seq, _) in enumerate(events)}
        frames = {}
        for row in fired:
            k, i = where[row[0]]
            frames[row[0]] = [e for _, e in per_key[k][i - self.count + 1:i + 1]]
        return frames


class _Correlate(_Query):
    """Pairs within ``within`` (inclusive): each new event joins the other side's window table.

    The queries' literals live in a *parameter table* (a row per query: its
    index, ``within`` and the literals of its predicate), which the join reads:
    queries of one shape (the JEPC correlations ``left.a - right.b = i + 1``,
    i = 1..Count, each with its window) share their window tables and run as
    one statement per batch (``JOIN params p``), not Count statements. A query
    joins a runner while it has seen no event, reading the same streams with
    the same filters, no explicit keys, and a predicate of the same shape.
    """

    def __init__(self, proc: SQLProcessor, query_id: Any, d: Definition) -> None:
        super().__init__(proc, query_id, d)
        t: Correlate = d.terminal
        self.left, self.right = d.stream.name, t.right
        schemas = {"left": self.schema, "right": proc._stream(t.right).schema}
        self.schemas = schemas
        self.born = self._seqs()
        if t.predicate is not None and not isinstance(t.predicate, Expr):
            raise _lambda_error(query_id, f"the correlation predicate {t.predicate!r}",
                                "ep.left('a') - ep.right('b') == 2")
        self.shape, values = _template(t.predicate)
        self.shareable = (t.on is None and t.left_key is None and t.right_key is None
                          and self.left != self.right and values is not None)
        if values is None:                           # literals a parameter table cannot hold: inline
            self.shape, values = (t.predicate, [])
        ptypes = {f"l{i}": type(v) for i, v in enumerate(values)}
        self.ptypes = ptypes
        pschema = Schema("params", ptypes) if ptypes else None
        p = proc.p()
        # The join condition, written once per direction (new left events, new right events).
        self.cond: dict[str, tuple[str, list]] = {}
        names = {"left": self.left, "right": self.right}
        derived = None
        if t.on is None and t.left_key is None and self.shape is not None:
            derived = equi_keys(self.shape, lambda side, name: ptypes.get(name) if side == "measure"
                                else proc._schema(names[side]).fields.get(name))
        for new, old in (("left", "right"), ("right", "left")):
            alias = {new: "n", old: "o"}
            sides = {s: (alias[s], schemas[s]) for s in ("left", "right")}
            if pschema is not None:
                sides["measure"] = ("p", pschema)
            params: list = []
            parts = ["o.ts >= n.ts - p.w AND o.ts <= n.ts + p.w"]
            lk = t.left_key if t.left_key is not None else t.on
            rk = t.right_key if t.right_key is not None else t.on
            if (lk is None) != (rk is None):
                raise ValueError(f"query {query_id!r}: give keys for both sides (on=, or left_key= and "
                                 f"right_key=)")
            if lk is None and derived is not None:      # equal keys the predicate implies: a hash join
                lk, rk = derived
            if lk is not None:
                kl = self._key(lk, "left", sides)
                kr = self._key(rk, "right", sides)
                parts.append(f"{kl[0]} = {kr[0]}")
                params += kl[1] + kr[1]
            if self.shape is not None:
                parts.append(self.predicate(self.shape, "correlation predicate", "n", params, sides))
            self.cond[new] = (" AND ".join(parts), params)
        self.tables_of = {"left": self.table(schemas["left"]), "right": self.table(schemas["right"])}
        self.events: dict[str, dict] = {"left": {}, "right": {}}
        self.members: dict[Any, tuple[int, int]] = {}      # query id -> (index, within)
        self.indices = itertools.count()
        self.params = f"ep_{next(_TABLES)}_params"
        cols = "".join(f", {column(n)} {proc.dialect.types[t_]}" for n, t_ in ptypes.items())
        proc.ddl(f"CREATE TEMPORARY TABLE {self.params} (q BIGINT, w BIGINT{cols})")
        self.tables.append(self.params)
        self._member(query_id, d, values)

    def _member(self, query_id: Any, d: Definition, values: list) -> None:
        from ..timeutil import parse_duration

        t = d.terminal
        within = parse_duration(t.within if t.within is not None else _span(d.stream.window, "correlate"))
        i = next(self.indices)
        self.members[query_id] = (i, within)
        self.within = max(w for _, w in self.members.values())
        self.proc.dialect.insert(self.proc.cur, self.params, ["q", "w", *map(column, self.ptypes)],
                                 [(i, within, *values)])
        self.proc.conn.commit()

    def joins(self, query_id: Any, d: Definition) -> bool:
        t = d.terminal
        if not (self.shareable and isinstance(t, Correlate) and (d.stream.name, t.right) == (self.left, self.right)
                and t.on is None and t.left_key is None and t.right_key is None
                and self._seqs() == self.born):
            return False
        shape, values = _template(t.predicate) if isinstance(t.predicate, Expr) or t.predicate is None \
            else (None, None)
        if values is None or repr(shape) != repr(self.shape) or \
                {f"l{i}": type(v) for i, v in enumerate(values)} != self.ptypes:
            return False
        probe = _Query(self.proc, query_id, d)           # the filters, as SQL: the same ones?
        if (probe.where, probe.where_params) != (self.where, self.where_params):
            return False
        self._member(query_id, d, values)
        return True

    def _seqs(self) -> tuple[int, int]:
        """How many events each side has seen (a query joins only while this is unchanged)."""
        return self.proc._streams[self.left].seq, self.proc._streams[self.right].seq

    def leave(self, query_id: Any) -> bool:
        i, _ = self.members.pop(query_id)
        if self.members and not self.proc._closed:
            self.proc.sql(f"DELETE FROM {self.params} WHERE q = {self.proc.p()}", [i])
            self.proc.conn.commit()
            self.within = max(w for _, w in self.members.values())
        return not self.members

    def _key(self, key: Any, side: str, sides: dict) -> tuple[str, list]:
        if isinstance(key, str):
            key = Col(key)
        if not isinstance(key, Expr):
            raise _lambda_error(self.query_id, f"the {side} key {key!r}", "left_key=ep.col('a') - 2")
        params: list = []
        mapped = {"event": sides[side], **({"measure": sides["measure"]} if "measure" in sides else {})}
        return to_sql(key, lambda f: self.column(f, mapped), self.proc.dialect, params), params

    def on_batch(self, stream: str, state: _SQLStream) -> None:
        """A stream correlated with itself: the batch as the left side, then as the right
        (as the native engine: every ordered pair within reach, an event with itself included)."""
        for side in ("left", "right"):
            if stream == getattr(self, side):
                self._side(side, state)

    def _side(self, side: str, state: _SQLStream) -> None:
        other = "right" if side == "left" else "left"
        p, wm = self.proc.p(), _bound(self.wm)
        where, wparams = (self.where, self.where_params) if side == "left" else (f"n.seq >= {p}", [LO])
        if min(e[TS_FIELD] for e in state.batch.values()) <= self.wm:
            late = self.proc.sql(f"SELECT seq FROM {state.table} n WHERE {where} AND n.ts <= {p} ORDER BY seq",
                                 [*wparams, wm])
            self.late.extend(state.batch[s] for (s,) in late)
        cond, cparams = self.cond[side]
        pairs = self.proc.sql(f"SELECT p.q, n.seq, o.seq FROM {state.table} n JOIN {self.params} p ON 1 = 1 "
                              f"JOIN {self.tables_of[other]} o ON {cond} WHERE {where} AND n.ts > {p} "
                              f"ORDER BY p.q, n.seq, o.seq", [*cparams, *wparams, wm])
        mine, theirs = state.batch, self.events[other]
        rows: dict[int, list] = {}
        for q, s, o in pairs:
            a, b = (mine[s], theirs[o]) if side == "left" else (theirs[o], mine[s])
            rows.setdefault(q, []).append({"left": a, "right": b, "ts": max(a[TS_FIELD], b[TS_FIELD])})
        for query_id, (i, _) in self.members.items():
            self.proc.emit(query_id, rows.get(i, []))
        fields = ", ".join(column(f) for f in self.schemas[side].fields)
        self.proc.sql(f"INSERT INTO {self.tables_of[side]} (seq, ts, {fields}) SELECT seq, ts, {fields} "
                      f"FROM {state.table} n WHERE {where} AND n.ts > {p}", [*wparams, wm])
        # The events the window table now holds, by seq (a superset: filtered ones are never asked for).
        self.events[side].update((s, e) for s, e in state.batch.items() if e[TS_FIELD] > self.wm)

    def on_watermark(self, wm: int) -> None:
        bound = wm - self.within                     # ts <= bound can meet nothing that is not late
        for side, table in self.tables_of.items():
            self.proc.sql(f"DELETE FROM {table} WHERE ts <= {self.proc.p()}", [_bound(bound)])
            events = self.events[side]
            for s in [s for s, e in events.items() if e[TS_FIELD] <= bound]:
                del events[s]


def _template(predicate: Any) -> tuple[Any, list | None]:
    """``predicate`` with each literal a column of the parameter table (``measure`` side ``l0``,
    ``l1``...), and the literals; ``(predicate, None)`` when one cannot be a column (null, bool)."""
    from ..operators.ep_correlate import template

    if predicate is None:
        return None, []
    if any(side == "measure" for side, _ in lift(predicate).refs()):
        return predicate, None                       # (refused later: no measures in a correlation)
    shape, values = template(predicate)
    if any(type(v) not in (int, float, str) for v in values):
        return predicate, None
    return shape, values


class _Symbols(dict):
    """An event with the truth of each symbol's database-side predicate (the symbol stream)."""

    __slots__ = ("bits",)


class _Pattern(_Query):
    """The symbol stream from the database, the NFA of ``operators/pattern.py`` on top."""

    def __init__(self, proc: SQLProcessor, query_id: Any, d: Definition) -> None:
        from pescheduler.operators.pattern import Pattern as NFA

        super().__init__(proc, query_id, d)
        t: Pattern = d.terminal
        within = t.within if t.within is not None else _span(d.stream.window, "pattern")
        _, do = pattern_functions(t.define, t.do)
        params: list = []
        bits, preds = [], {}
        for i, (symbol, pred) in enumerate(t.define.items()):
            pred = pred if isinstance(pred, Expr) or callable(pred) else lift(pred)
            if not isinstance(pred, Expr):
                raise _lambda_error(query_id, f"the predicate of symbol {symbol!r}",
                                    "ep.col('a') - ep.measure('z1') == 1")
            parts = conjuncts(pred)
            in_db = [c for c in parts if not any(s == "measure" for s, _ in c.refs())]
            rest = [c for c in parts if any(s == "measure" for s, _ in c.refs())]
            sql = " AND ".join(self.predicate(c, "pattern predicate", "n", params) for c in in_db)
            bits.append(f"CASE WHEN {sql or '1 = 1'} THEN 1 ELSE 0 END")
            preds[symbol] = self._symbol(i, rest)
        self.bits, self.bit_params, self.nfa_symbols = ", ".join(bits), params, list(t.define)
        self.symbols_sql = f"SELECT seq, {self.bits} FROM {{batch}} n WHERE {self.where} ORDER BY seq"
        self.symbol_params = params + self.where_params
        key = d.stream.key
        self.nfa = NFA(t.pattern, preds, do=do, within=within, output=t.output, key=key)
        if self.wm > MIN_WATERMARK:
            self.nfa.on_watermark(self.wm, Emitter())

    @staticmethod
    def _symbol(i: int, rest: list[Expr]) -> Callable:
        if not rest:
            return lambda e, m: e.bits[i]
        fns = [c.function() for c in rest]
        return lambda e, m: e.bits[i] and all(fn(e, m) for fn in fns)

    def on_batch(self, stream: str, state: _SQLStream) -> None:
        self.feed(self.proc.sql(self.symbols_sql.format(batch=state.table), self.symbol_params), state)

    def feed(self, rows: list, state: _SQLStream) -> None:
        """``(seq, bit, ...)`` of the events that passed the filters, in order, to the NFA."""
        events = []
        for seq, *bits in rows:
            e = _Symbols(state.batch[seq])
            e.bits = [bool(b) for b in bits]
            events.append(e)
        out = Emitter()
        self.nfa.process(events, out)
        self.late.extend(dict(e) for e in (out.sides or {}).get("late", ()))

    def on_watermark(self, wm: int) -> None:
        out = Emitter()
        self.nfa.on_watermark(wm, out)
        self.proc.emit(self.query_id, list(out))

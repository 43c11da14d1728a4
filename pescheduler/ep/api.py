"""The provider-independent API: windows, query definitions, and the processor's contract.

A query is a *definition* (a composition of operator objects: a stream with a
window, then filters, then at most one of aggregate / correlate / pattern) and
means the same on every provider; :class:`EventProcessor` dispatches on
``provider=`` to the native engine (``native.py``) or to the SQL bridge
(``sql.py``) and holds what both share: output processors, the checks of a
pushed batch, the end of the streams.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from ..operator import DeadLetter
from ..timeutil import parse_duration
from ..joinkeys import equi_keys
from .lifted import as_expression, lift_pattern
from .predicates import Expr
from .schema import Schema, SchemaError

logger = logging.getLogger(__name__)

# -- windows ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tumbling:
    """Tumbling event-time windows of ``size`` (operators/window.py)."""

    size: Any

    def operator(self) -> tuple[str, dict]:
        return "window", {"size": self.size}

    @property
    def span(self) -> int:
        return parse_duration(self.size)


@dataclass(frozen=True)
class Sliding:
    """Sliding event-time windows of ``size`` every ``slide`` (operators/window.py), or with
    ``slide="event"`` a result per event over the ``size`` before it (operators/over_window.py)."""

    size: Any
    slide: Any

    def operator(self) -> tuple[str, dict]:
        if self.slide == "event":
            return "over_window", {"size": self.size}
        return "window", {"size": self.size, "slide": self.slide}

    @property
    def span(self) -> int:
        return parse_duration(self.size)


@dataclass(frozen=True)
class Session:
    """Session windows closed by a ``gap`` without events (operators/session.py)."""

    gap: Any

    def operator(self) -> tuple[str, dict]:
        return "session_window", {"gap": self.gap}

    span = None


@dataclass(frozen=True)
class CountWindow:
    """Windows of ``count`` tuples per key, every ``slide`` tuples (operators/count_window.py)."""

    count: int
    slide: int | None = None

    def operator(self) -> tuple[str, dict]:
        return "count_window", {"count": self.count, "slide": self.slide}

    span = None


# -- definitions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Filter:
    """Keep events where ``predicate(event)`` is true."""

    predicate: Callable[[dict], bool]


@dataclass(frozen=True)
class Aggregate:
    """``{output: (function, field)}`` over the stream's window (one row per key and window)."""

    aggregates: dict


@dataclass(frozen=True)
class Correlate:
    """Pairs with events of stream ``right`` at most ``within`` apart (default: the window's size)
    where ``predicate(left, right)`` holds; results are ``{"left", "right", "ts"}`` (operators/join.py).

    Equal keys first, when given (``on``: one field of both; ``left_key``/``right_key``: a
    field or function per side): a hash lookup instead of testing every pair in the window.
    """

    right: str
    predicate: Callable[[dict, dict], bool] | None = None
    on: str | None = None
    within: Any = None
    left_key: str | Callable | None = None
    right_key: str | Callable | None = None


@dataclass(frozen=True)
class Pattern:
    """A sequential pattern (operators/pattern.py); ``within`` defaults to the window's size."""

    pattern: str
    define: dict
    do: dict | None = None
    output: Callable[[dict], dict] | None = None
    within: Any = None


@dataclass(frozen=True)
class Output:
    """The end of a definition (optional: results always go to the query's output processors)."""


_TERMINALS = (Aggregate, Correlate, Pattern)


class _Compose:
    """The fluent methods shared by :class:`Stream` and :class:`Definition`."""

    def then(self, step: Any) -> "Definition":
        return Definition(self._steps() + (step,))

    def filter(self, predicate: Callable[[dict], bool]) -> "Definition":
        return self.then(Filter(predicate))

    def aggregate(self, aggregates: dict) -> "Definition":
        return self.then(Aggregate(aggregates))

    def correlate(self, right: str, predicate: Callable | None = None, **params: Any) -> "Definition":
        return self.then(Correlate(right, predicate, **params))

    def pattern(self, pattern: str, define: dict, **params: Any) -> "Definition":
        return self.then(Pattern(pattern, define, **params))

    def output(self) -> "Definition":
        return self.then(Output())


@dataclass(frozen=True)
class Stream(_Compose):
    """A registered stream as a query's input, with its ``window`` and ``key`` (a field)."""

    name: str
    window: Tumbling | Sliding | Session | CountWindow | None = None
    key: str | None = None

    def _steps(self) -> tuple:
        return (self,)


@dataclass(frozen=True)
class Definition(_Compose):
    """A query: ``(Stream, Filter*, [Aggregate | Correlate | Pattern], [Output])``.

    Build it fluently (``ep.Stream(...).filter(...).aggregate(...)``) or from
    a list of operator objects, e.g. generated: ``ep.Definition([ep.Stream(...),
    ep.Filter(...)])``. It is checked here, so a malformed one fails where it is built.
    """

    steps: tuple

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        object.__setattr__(self, "steps", steps)
        if not steps or not isinstance(steps[0], Stream):
            raise ValueError(f"a definition starts with an ep.Stream, got {steps[:1]}")
        body = list(steps[1:])
        if body and isinstance(body[-1], Output):
            body.pop()
        while body and isinstance(body[0], Filter):
            body.pop(0)
        if len(body) > 1 or (body and not isinstance(body[0], _TERMINALS)):
            raise ValueError(f"a definition is Stream, Filter*, then at most one of Aggregate, "
                             f"Correlate or Pattern, then Output; got {[type(s).__name__ for s in steps]}")

    def _steps(self) -> tuple:
        return tuple(s for s in self.steps if not isinstance(s, Output))

    @property
    def stream(self) -> Stream:
        return self.steps[0]

    @property
    def filters(self) -> list[Filter]:
        return [s for s in self.steps if isinstance(s, Filter)]

    @property
    def terminal(self) -> Aggregate | Correlate | Pattern | None:
        return next((s for s in self.steps if isinstance(s, _TERMINALS)), None)

    def streams(self) -> set[str]:
        """Every stream the query reads."""
        t = self.terminal
        return {self.stream.name} | ({t.right} if isinstance(t, Correlate) else set())


def as_definition(definition: Any) -> Definition:
    """A :class:`Definition` from itself, a bare :class:`Stream`, or a list of operator objects."""
    if isinstance(definition, Definition):
        return definition
    if isinstance(definition, Stream):
        return Definition((definition,))
    if isinstance(definition, (list, tuple)):
        return Definition(tuple(definition))
    raise TypeError(f"a query definition is an ep.Definition, an ep.Stream or a list of operator "
                    f"objects, got {definition!r}")




def first_whole_start(window: Any, newest: int) -> int | None:
    """The first ``window_start`` a window query created after an event at ``newest`` (the newest
    time pushed on its stream so far) sees whole, or None when every window it reports is whole.

    The one rule for queries added to a running stream (docs/operators.md): a query reports a
    window only with the value a query created before the stream would report, never a partial
    one that looks whole. An event pushed before the query (at ``newest`` or earlier, held by
    ``max_delay`` or not) can fall in a time window that starts at or before ``newest`` and in no
    later one; a session it belongs to starts less than ``gap`` after it. A count window is its
    ``count`` events of the key, all seen by the query: whole by definition.
    """
    if isinstance(window, Session):
        return newest + parse_duration(window.gap)
    if isinstance(window, (Tumbling, Sliding)):
        return newest + 1
    return None


def _span(window: Any, what: str) -> int:
    span = getattr(window, "span", None)
    if span is None:
        raise ValueError(f"{what}: give within=, or a time window (ep.Tumbling/ep.Sliding) on the "
                         f"stream whose size bounds it")
    return span


def correlation_keys(d: "Definition", t: Correlate, schema: Callable[[str], Any]) -> tuple | None:
    """Equal keys hidden in an expression predicate without ``on=``/keys (``joinkeys.equi_keys``), or None.

    Both providers use them: a hash lookup of the other side's window instead
    of testing the predicate on every pair (it is still tested on the pairs found).
    """
    if not isinstance(t.predicate, Expr) or t.on is not None or t.left_key is not None or \
            any(side not in ("left", "right") for side, _ in t.predicate.refs()):
        return None
    names = {"left": d.stream.name, "right": t.right}
    return equi_keys(t.predicate, lambda side, name: schema(names[side]).fields.get(name))


def function(fn: Any) -> Any:
    """What the native engine calls: an expression compiled to Python, anything else as it is."""
    return fn.function() if isinstance(fn, Expr) else fn


# -- the processor -------------------------------------------------------------------------------
ENGINES: dict[str, type] = {}     # "native", "sql": the EventProcessor class a provider runs on


def engine(name: str) -> Callable[[type], type]:
    """Class decorator: ``name``'s engine is the class (``native.py`` and ``sql.py`` register
    theirs), so ``EventProcessor(provider)`` picks it without importing the module that defines
    it (which imports this one)."""
    def register(cls: type) -> type:
        ENGINES[name] = cls
        return cls
    return register


def engine_for(provider: Any) -> type:
    """The engine ``provider`` runs on: ``"native"``, else the SQL bridge (a database)."""
    return ENGINES["native" if provider == "native" else "sql"]


class EventProcessor:
    """Streams, queries and output processors on one provider.

    ``EventProcessor()`` or ``provider="native"``: the in-process engine built on
    the project's operators (``native.py``). ``"sqlite"``, ``"duckdb"``, a URL
    such as ``"postgresql://user@host/db"``, or any open DB-API 2.0 connection:
    the SQL bridge (``sql.py``), where the database stores the windows and
    runs the predicates, aggregates, joins and pattern symbols. The same calls
    give the same results on every provider.

    ``max_delay`` (per stream, default 0): bounded out-of-orderness of its
    events; an event more than that behind the newest is late and goes to
    :meth:`late` instead of its windows (never dropped silently).
    """

    def __new__(cls, provider: Any = "native", *args: Any, **kwargs: Any) -> "EventProcessor":
        return super().__new__(engine_for(provider) if cls is EventProcessor else cls)

    def __init__(self, provider: Any = "native") -> None:
        self.provider = provider
        self._queries: dict[Any, Definition] = {}
        self._processors: dict[Any, list[Callable]] = {}
        self._dead: list[DeadLetter] = []
        self._streams: dict[str, Any] = {}
        self._whole_from: dict[Any, int] = {}      # query id -> first window start it saw whole
        self._python: dict[Any, list[str]] = {}     # query id -> its lambdas kept as calls, and why
        self._closed = False

    # -- the calls every provider implements ----------------------------------------------
    def register_stream(self, name: str, schema: Mapping[str, Any], max_delay: Any = 0) -> None:
        """Declare stream ``name`` with ``schema`` ({field: type}); events are checked against it."""
        raise NotImplementedError

    def remove_stream(self, name: str) -> None:
        """Forget stream ``name``; refused while a query reads it."""
        raise NotImplementedError

    def create_query(self, query_id: Any, definition: Any) -> None:
        """Start ``definition`` (see :class:`Definition`) as ``query_id``; results go to its processors."""
        raise NotImplementedError

    def remove_query(self, query_id: Any) -> None:
        """Stop ``query_id``; what it shared with other queries goes on for them, state intact."""
        raise NotImplementedError

    def _schema(self, stream: str) -> Schema:
        """The schema of registered ``stream`` (KeyError naming the registered ones)."""
        return self._stream(stream).schema

    def _stream(self, name: str) -> Any:
        try:
            return self._streams[name]
        except KeyError:
            raise KeyError(f"unknown stream {name!r}; registered: {sorted(self._streams)}") from None

    def _check_new_stream(self, name: str) -> None:
        self._open()
        if not isinstance(name, str) or not name:
            raise ValueError(f"a stream name is a non-empty string, got {name!r}")
        if name in self._streams:
            raise ValueError(f"stream {name!r} is registered already")

    def _new_query(self, query_id: Any, definition: Any) -> Definition:
        """``definition`` checked for a new query ``query_id`` over registered streams."""
        self._open()
        definition = as_definition(definition)
        if query_id in self._queries:
            raise ValueError(f"query {query_id!r} exists already")
        for name in definition.streams():
            self._stream(name)
        notes: list[str] = []
        lifted = lift_definition(definition, self._schema, notes)     # lambdas as expressions where exact
        self._python[query_id] = [f"query {query_id!r}: {n} (not lifted to an expression)" for n in notes]
        for note in self._python[query_id]:
            logger.info("%s", note)                                  # once: at create_query
        return lifted

    def python_calls(self, query_id: Any) -> list[str]:
        """Why each lambda of ``query_id`` is called per event instead of run as an expression
        (empty: every one was lifted, or it has none); also logged once, at ``create_query``."""
        self._known_query(query_id)
        return list(self._python.get(query_id, ()))

    def _note_whole_from(self, query_id: Any, d: Definition, newest: int | None) -> None:
        """A window query created after events came in (the newest at ``newest``) reports only
        the windows it saw whole (:func:`first_whole_start`); its output drops the others."""
        start = None if newest is None or not isinstance(d.terminal, Aggregate) \
            else first_whole_start(d.stream.window, newest)
        if start is None:
            self._whole_from.pop(query_id, None)
        else:
            self._whole_from[query_id] = start

    def _check_unread(self, name: str) -> Any:
        """The state of stream ``name``, which no query may read any more (it is being removed)."""
        state = self._stream(name)
        users = [q for q, d in self._queries.items() if name in d.streams()]
        if users:
            raise ValueError(f"stream {name!r} is read by queries {users}; remove them first")
        return state

    def _push(self, stream: str, events: list[dict]) -> None:
        """Process checked ``events`` (with ``ts``) of ``stream`` as one batch."""
        raise NotImplementedError

    def late(self, query_id: Any) -> list:
        """Events that arrived too late for ``query_id``'s windows, correlation or pattern."""
        raise NotImplementedError

    def dead_letters(self) -> list[DeadLetter]:
        """Events or results an operator or output processor rejected, with the error."""
        return list(self._dead)

    def _end(self) -> None:
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------
    def push_event(self, stream: str, payload: Mapping[str, Any], ts: int) -> None:
        """Process one event of ``stream`` at event time ``ts`` (ms).

        A payload that does not fit the schema raises :class:`SchemaError`
        and changes nothing.
        """
        try:                                # the hot path: no helper call per event
            schema = self._streams[stream].schema
        except KeyError:
            schema = self._schema(stream)   # raises, naming the registered streams
        if self._closed:
            self._open()                    # raises
        self._push(stream, [schema.event(payload, ts)])

    def push_events(self, stream: str, events: Iterable[tuple[Mapping[str, Any], int]]) -> None:
        """``push_event`` for many ``(payload, ts)``: all are checked before any is processed,
        then they are processed as one batch (triggering per batch, not per event, is faster)."""
        schema = self._schema(stream)
        self._open()
        checked = []
        for i, (payload, ts) in enumerate(events):
            try:
                checked.append(schema.event(payload, ts))
            except SchemaError as exc:
                raise SchemaError(f"event {i}: {exc}; no event of this call was processed") from None
        self._push(stream, checked)

    def add_output_processor(self, query_id: Any, fn: Callable[[dict], Any]) -> None:
        """Call ``fn(result)`` for every result of ``query_id`` from now on."""
        if not callable(fn):
            raise TypeError(f"an output processor is callable(result), got {fn!r}")
        self._query_processors(query_id).append(fn)

    def remove_output_processor(self, query_id: Any, fn: Callable) -> None:
        fns = self._query_processors(query_id)
        if fn not in fns:
            raise ValueError(f"{fn!r} is not an output processor of query {query_id!r}")
        fns.remove(fn)

    def _query_processors(self, query_id: Any) -> list:
        try:
            return self._processors[query_id]
        except KeyError:
            raise KeyError(f"unknown query {query_id!r}; known: {list(self._queries)}") from None

    def _known_query(self, query_id: Any) -> Definition:
        try:
            return self._queries[query_id]
        except KeyError:
            raise KeyError(f"unknown query {query_id!r}; known: {list(self._queries)}") from None

    def close(self) -> None:
        """End every stream: windows still open fire, results reach the output processors."""
        if self._closed:
            return
        self._end()
        self._closed = True

    def __enter__(self) -> "EventProcessor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _open(self) -> None:
        if self._closed:
            raise RuntimeError("this EventProcessor is closed (its streams have ended)")


def lift_definition(d: Any, schema: Callable[[str], Any], notes: list[str] | None = None) -> Any:
    """Definition ``d`` with each filter's and correlation's lambda predicate, and a pattern's
    lambdas, a ``col`` expression where :func:`as_expression` (:func:`lift_pattern`) proves them
    the same (``schema(stream)``: its Schema); ``notes`` gets one line per lambda kept as a call."""
    notes = [] if notes is None else notes

    def types(stream: str) -> Callable[[str], Any]:
        return schema(stream).fields.get

    steps = []
    for step in d.steps:
        sides: dict = {}
        if isinstance(step, Filter):
            sides = {"event": types(d.stream.name)}
        elif isinstance(step, Correlate) and step.predicate is not None:
            sides = {"left": types(d.stream.name), "right": types(step.right)}
        elif isinstance(step, Pattern):
            steps.append(lift_pattern(step, types(d.stream.name), notes))
            continue
        why: list[str] = []
        expr = as_expression(step.predicate, tuple(sides), lambda side, name: sides[side](name), why) \
            if sides else None
        notes.extend(f"its {type(step).__name__.lower()} predicate is called: {w}" for w in why)
        steps.append(step if expr is None else replace(step, predicate=expr))
    return Definition(tuple(steps))

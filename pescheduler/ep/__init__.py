"""Event processing through a provider-independent API (after JEPC, BTW 2013).

Streams are registered with a schema, queries are *definitions* (a
composition of operator objects: a stream with a window, then filters, then
at most one of aggregate / correlate / pattern), and results go to output
processors. The same definitions run in-process or compile to an
:class:`~pescheduler.plan.app.Application` deployed on the PE runtime::

    from pescheduler import ep

    proc = ep.EventProcessor()
    proc.register_stream("sensors", {"id": str, "a": int, "b": int})
    proc.create_query("hot", ep.Stream("sensors", window=ep.Tumbling("1s"), key="id")
                      .filter(lambda e: e["a"] > e["b"])
                      .aggregate({"n": "count", "avg_a": ("avg", "a")}))
    results = []
    proc.add_output_processor("hot", results.append)
    proc.push_event("sensors", {"id": "s1", "a": 3, "b": 1}, ts=10)
    proc.close()                       # end of the streams: every window fires
    assert results == [{"id": "s1", "window_start": 0, "window_end": 1000, "n": 1, "avg_a": 3.0}]

In-process, events go through a :class:`pescheduler.worker.chain.Chain` of the
registered operator plug-ins, fed and watermarked by
:class:`pescheduler.worker.source_driver.SourceDriver` exactly as in a PE: one code
path. :meth:`EventProcessor.application` builds the same operators, with the
same parameters, into an ``Application``.

Sharing: aggregate queries that read the same stream (no filter in front),
key and window share one window operator and one aggregate plan, so each
distinct aggregate is computed once per window for all of them; queries may
come and go while events flow (see ``operators/window.py``).

Schemas: ``push_event`` checks the payload and raises :class:`SchemaError`
(naming the field and the type it expects) before anything changes. A
deployed application checks the same way in an ``ep_schema`` operator and
dead-letters what does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ..plan.app import Application, Stream as AppStream
from ..worker.chain import Chain, MIN_WATERMARK
from ..operator import DeadLetter, Operator, OperatorContext
from ..worker.source_driver import SourceDriver, pump
from ..timeutil import parse_duration

TS_FIELD = "ts"

_TYPES: dict[str, type] = {"int": int, "integer": int, "long": int, "float": float, "double": float,
                           "number": float, "str": str, "string": str, "bool": bool, "boolean": bool}


# -- schemas ---------------------------------------------------------------------------------
class SchemaError(ValueError):
    """An event that does not fit its stream's schema; the message names the field and the fix."""


class Schema:
    """Field name -> type (``int``, ``float``, ``str``, ``bool``, or those names as strings).

    An ``int`` is accepted for a ``float`` field; ``bool`` is not an ``int``.
    Events carry their time under ``ts`` (milliseconds, an int), so a schema
    cannot declare that field.
    """

    def __init__(self, stream: str, fields: Mapping[str, Any]) -> None:
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError(f"stream {stream!r}: a schema is a dict {{field: type}}, got {fields!r}")
        if TS_FIELD in fields:
            raise ValueError(f"stream {stream!r}: {TS_FIELD!r} is the event time given to push_event; "
                             f"rename that field")
        self.stream = stream
        self.fields = {name: self._type(name, t) for name, t in fields.items()}

    def _type(self, name: str, t: Any) -> type:
        t = _TYPES.get(t, t) if isinstance(t, str) else t
        if t not in (int, float, str, bool):
            raise ValueError(f"stream {self.stream!r}: field {name!r} has type {t!r}; "
                             f"use int, float, str or bool")
        return t

    def event(self, payload: Any, ts: Any) -> dict:
        """The event to process: ``payload`` checked, with its time under ``ts``."""
        self._check_ts(ts)
        self._check_payload(payload, ())
        return {**payload, TS_FIELD: ts}

    def check_event(self, event: Any) -> None:
        """Check an event that carries its time (what a deployed source reads)."""
        if isinstance(event, Mapping):
            if TS_FIELD not in event:
                raise SchemaError(f"stream {self.stream!r}: field {TS_FIELD!r} (event time, int ms) "
                                  f"is missing")
            self._check_ts(event[TS_FIELD])
        self._check_payload(event, (TS_FIELD,))

    def _check_ts(self, ts: Any) -> None:
        if isinstance(ts, bool) or not isinstance(ts, int):
            raise SchemaError(f"stream {self.stream!r}: the event time {TS_FIELD!r} must be int "
                              f"(milliseconds), got {type(ts).__name__} {ts!r}")

    def _check_payload(self, payload: Any, also: tuple) -> None:
        if not isinstance(payload, Mapping):
            raise SchemaError(f"stream {self.stream!r}: an event is a dict of {self.describe()}, "
                              f"got {type(payload).__name__} {payload!r}")
        for name, t in self.fields.items():
            if name not in payload:
                raise SchemaError(f"stream {self.stream!r}: field {name!r} ({t.__name__}) is missing")
            value = payload[name]
            ok = isinstance(value, t) and not (t is int and isinstance(value, bool))
            if t is float and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            if not ok:
                raise SchemaError(f"stream {self.stream!r}: field {name!r} must be {t.__name__}, "
                                  f"got {type(value).__name__} {value!r}")
        extra = [k for k in payload if k not in self.fields and k not in also]
        if extra:
            raise SchemaError(f"stream {self.stream!r}: unknown field {extra[0]!r}; "
                              f"the schema is {self.describe()}")

    def describe(self) -> str:
        return "{" + ", ".join(f"{k}: {t.__name__}" for k, t in self.fields.items()) + "}"

    def __repr__(self) -> str:
        return f"Schema({self.stream!r}, {self.describe()})"


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


# -- the processor -------------------------------------------------------------------------------
@dataclass
class _Node:
    """One operator of the processor's graph, as ``application()`` rebuilds it."""

    op: Operator
    kind: str
    name: str
    inputs: list[str]
    owners: set = field(default_factory=set)     # query ids using it


@dataclass
class _StreamState:
    schema: Schema
    max_delay: int
    op_id: str
    source: Operator
    driver: SourceDriver


class EventProcessor:
    """Streams, queries and output processors, run in-process; see the module docstring.

    ``max_delay`` (per stream, default 0): bounded out-of-orderness of its
    events; an event more than that behind the newest is late and goes to
    :meth:`late` instead of its windows (never dropped silently).
    ``share=False`` gives every aggregate query its own window operator (the
    baseline the sharing benchmark measures against).
    """

    def __init__(self, share: bool = True) -> None:
        self.share = share
        self._streams: dict[str, _StreamState] = {}
        self._queries: dict[Any, Definition] = {}
        self._processors: dict[Any, list[Callable]] = {}
        self._nodes: dict[str, _Node] = {}          # insertion order is topological
        self._groups: dict[tuple, str] = {}         # shared window key -> op id
        self._late: dict[str, list] = {}
        self._dead: list[DeadLetter] = []
        self._chain: Chain | None = None
        self._closed = False
        self._rebuild()

    # -- streams ------------------------------------------------------------------------------
    def register_stream(self, name: str, schema: Mapping[str, Any], max_delay: Any = 0) -> None:
        """Declare stream ``name`` with ``schema`` ({field: type}); events are checked against it."""
        from pescheduler.operators.ep_io import PushedSource

        self._open()
        if not isinstance(name, str) or not name:
            raise ValueError(f"a stream name is a non-empty string, got {name!r}")
        if name in self._streams:
            raise ValueError(f"stream {name!r} is registered already")
        source = PushedSource(max_delay=max_delay)
        op_id = f"stream.{name}"
        self._streams[name] = _StreamState(Schema(name, schema), source.max_delay, op_id, source,
                                           SourceDriver(op_id, source, 10_000))
        self._rebuild()

    def remove_stream(self, name: str) -> None:
        """Forget stream ``name``; refused while a query reads it."""
        self._stream(name)
        users = [q for q, d in self._queries.items() if name in d.streams()]
        if users:
            raise ValueError(f"stream {name!r} is read by queries {users}; remove them first")
        del self._streams[name]
        self._rebuild()

    def _stream(self, name: str) -> _StreamState:
        try:
            return self._streams[name]
        except KeyError:
            raise KeyError(f"unknown stream {name!r}; registered: {sorted(self._streams)}") from None

    # -- queries ------------------------------------------------------------------------------
    def create_query(self, query_id: Any, definition: Any) -> None:
        """Start ``definition`` (see :class:`Definition`) as ``query_id``; results go to its processors."""
        self._open()
        definition = as_definition(definition)
        if query_id in self._queries:
            raise ValueError(f"query {query_id!r} exists already")
        for name in definition.streams():
            self._stream(name)
        self._processors[query_id] = []
        try:
            self._build(query_id, definition)
        except Exception:
            self._drop_owner(query_id)
            del self._processors[query_id]
            raise
        self._queries[query_id] = definition
        self._rebuild()

    def remove_query(self, query_id: Any) -> None:
        """Stop ``query_id``; what it shared with other queries goes on for them, state intact."""
        if query_id not in self._queries:
            raise KeyError(f"unknown query {query_id!r}; known: {list(self._queries)}")
        self._drop_owner(query_id)
        del self._queries[query_id], self._processors[query_id]
        self._rebuild()

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

    # -- events -------------------------------------------------------------------------------
    def push_event(self, stream: str, payload: Mapping[str, Any], ts: int) -> None:
        """Process one event of ``stream`` at event time ``ts`` (ms).

        A payload that does not fit the schema raises :class:`SchemaError`
        and changes nothing.
        """
        state = self._stream(stream)
        self._open()
        state.source.offer([state.schema.event(payload, ts)])
        self._pump(state)

    def push_events(self, stream: str, events: Iterable[tuple[Mapping[str, Any], int]]) -> None:
        """``push_event`` for many ``(payload, ts)``: all are checked before any is processed."""
        state = self._stream(stream)
        self._open()
        checked = []
        for i, (payload, ts) in enumerate(events):
            try:
                checked.append(state.schema.event(payload, ts))
            except SchemaError as exc:
                raise SchemaError(f"event {i}: {exc}; no event of this call was processed") from None
        state.source.offer(checked)
        self._pump(state)

    def _pump(self, state: _StreamState) -> None:
        """Move what the stream's source holds into the chain, with watermarks, as a PE does."""
        while pump(state.driver, self._chain):
            pass

    def close(self) -> None:
        """End every stream: windows still open fire, results reach the output processors."""
        if self._closed:
            return
        for state in self._streams.values():
            state.source.end()
            self._pump(state)
        self._closed = True

    def __enter__(self) -> "EventProcessor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _open(self) -> None:
        if self._closed:
            raise RuntimeError("this EventProcessor is closed (its streams have ended)")

    # -- what came out besides results --------------------------------------------------------
    def late(self, query_id: Any) -> list:
        """Events that arrived too late for ``query_id``'s windows, correlation or pattern."""
        return [e for op_id, node in self._nodes.items() if query_id in node.owners
                for e in self._late.get(op_id, ())]

    def dead_letters(self) -> list[DeadLetter]:
        """Events or results an operator or output processor rejected, with the error."""
        return self._dead + self._chain.dead_letters

    # -- building the graph -------------------------------------------------------------------
    def _build(self, query_id: Any, d: Definition) -> None:
        """Add the operators of ``d``; an aggregate joins a shared window when one fits."""
        prev = self._streams[d.stream.name].op_id
        for i, f in enumerate(d.filters, start=1):
            prev = self._add(f"{query_id}.filter{i}", "filter", {"fn": f.predicate}, [prev], query_id)
        t, window = d.terminal, d.stream.window
        if isinstance(t, Aggregate):
            self._aggregate(query_id, d.stream, prev, t)
            return
        if isinstance(t, Correlate):
            within = t.within if t.within is not None else _span(window, "correlate")
            keys = {name: getattr(t, name) for name in ("on", "left_key", "right_key")
                    if getattr(t, name) is not None}
            prev = self._add(f"{query_id}.correlate", "join",
                             {"within": within, "predicate": t.predicate, **keys},
                             [prev, self._stream(t.right).op_id], query_id)
        elif isinstance(t, Pattern):
            within = t.within if t.within is not None else _span(window, "pattern")
            prev = self._add(f"{query_id}.pattern", "pattern",
                             {"pattern": t.pattern, "define": t.define, "do": t.do, "within": within,
                              "output": t.output, "key": d.stream.key}, [prev], query_id)
        self._add(f"{query_id}.out", "ep_output", {"processors": {query_id: self._processors[query_id]}},
                  [prev], query_id, kind="sink")

    def _aggregate(self, query_id: Any, stream: Stream, prev: str, t: Aggregate) -> None:
        if stream.window is None:
            raise ValueError(f"query {query_id!r}: an aggregate needs a window on its stream, "
                             f"e.g. ep.Stream({stream.name!r}, window=ep.Tumbling('1s'))")
        name, params = stream.window.operator()
        group = (prev, name, tuple(sorted(params.items())), stream.key,
                 None if self.share else query_id)
        op_id = self._groups.get(group)
        if op_id is None:
            op_id = f"{name}{len(self._groups) + 1}.{stream.name}"
            while op_id in self._nodes:
                op_id += "'"
            self._add(op_id, name, {**params, "key": stream.key, "queries": {query_id: t.aggregates}},
                      [prev], query_id)
            self._add(f"{op_id}.out", "ep_output", {"processors": self._processors, "tagged": True},
                      [op_id], query_id, kind="sink")
            self._groups[group] = op_id
            return
        self._nodes[op_id].op.add_query(query_id, t.aggregates)
        for shared in (op_id, f"{op_id}.out"):
            self._nodes[shared].owners.add(query_id)

    def _add(self, op_id: str, name: str, params: dict, inputs: list[str], query_id: Any,
             kind: str = "operator") -> str:
        from ..plugins import active_plugins

        if op_id in self._nodes:
            raise ValueError(f"operator id {op_id!r} is taken; choose another query id")
        op = active_plugins().operator(name, kind)(**params)
        op.open(OperatorContext(op_id, pe_id="ep", extra={"inputs": list(inputs)}))
        self._nodes[op_id] = _Node(op, kind, name, list(inputs), {query_id})
        return op_id

    def _drop_owner(self, query_id: Any) -> None:
        """Release what ``query_id`` used: shared windows drop its query, unused operators go."""
        for op_id, node in list(self._nodes.items()):
            if query_id not in node.owners:
                continue
            node.owners.discard(query_id)
            if query_id in getattr(node.op, "query_ids", ()):
                node.op.remove_query(query_id)
            if not node.owners:
                del self._nodes[op_id]
                self._late.pop(op_id, None)
        live = set(self._nodes)
        self._groups = {g: op_id for g, op_id in self._groups.items() if op_id in live}

    def _rebuild(self) -> None:
        """A new chain over the current operators; operator state and watermarks carry over."""
        ops = {s.op_id: s.source for s in self._streams.values()}
        ops.update((op_id, n.op) for op_id, n in self._nodes.items())
        edges = [(src, "out", op_id) for op_id, n in self._nodes.items() for src in n.inputs]
        old, self._chain = self._chain, Chain(ops, edges, on_side=self._side)
        if old is not None:
            self._dead.extend(old.dead_letters)
            self._chain.restore_progress({k: v for k, v in old.progress().items() if k in ops})
        for state in self._streams.values():
            if state.driver.emitted_wm > MIN_WATERMARK:     # bring new operators up to event time
                self._chain.watermark_from(state.op_id, state.driver.emitted_wm)

    def _side(self, op_id: str, port: str, items: list) -> None:
        self._late.setdefault(op_id, []).extend(items)

    # -- compiling to an application ------------------------------------------------------------
    def application(self, name: str, sources: Mapping[str, Any]) -> Application:
        """The queries as an :class:`Application` for ``pescheduler.deploy``.

        ``sources[stream]`` says where each stream's events come from in the
        deployment: ``(registry_name, params)`` of a source (its tuples carry
        ``ts``), or a list of ``(payload, ts)`` pairs (an ``iterable`` source).
        Every event passes an ``ep_schema`` check; then come the very
        operators this processor runs, with their current parameters
        (``Operator.parameters()``: shared windows carry all their queries).
        """
        app = Application(name)
        handles: dict[str, AppStream] = {}
        used = set().union(*(d.streams() for d in self._queries.values())) if self._queries else set()
        for stream in sorted(used):
            state = self._stream(stream)
            if stream not in sources:
                raise ValueError(f"application: no source for stream {stream!r}; pass "
                                 f"sources={{{stream!r}: ('jsonl', {{'path': ...}})}} or a list of events")
            src_name, params = _source_spec(sources[stream])
            params.setdefault("max_delay", state.max_delay)
            raw = app.source(src_name, id=f"{state.op_id}.source", **params)
            handles[state.op_id] = raw.apply("ep_schema", id=state.op_id, schema=state.schema)
        for op_id, node in self._nodes.items():
            ins = [handles[src] for src in node.inputs]
            params = node.op.parameters()
            if node.kind == "sink":
                handles[op_id] = ins[0].sink(node.name, id=op_id, **params)
            elif len(ins) == 2:
                handles[op_id] = ins[0].join(ins[1], id=op_id, **params)
            else:
                handles[op_id] = ins[0].apply(node.name, id=op_id, **params)
        return app


def _span(window: Any, what: str) -> int:
    span = getattr(window, "span", None)
    if span is None:
        raise ValueError(f"{what}: give within=, or a time window (ep.Tumbling/ep.Sliding) on the "
                         f"stream whose size bounds it")
    return span


def _source_spec(spec: Any) -> tuple[str, dict]:
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str):
        return spec[0], dict(spec[1])
    if isinstance(spec, list):
        return "iterable", {"items": [{**payload, TS_FIELD: ts} for payload, ts in spec]}
    raise TypeError(f"a stream's source is (registry_name, params) or a list of (payload, ts), "
                    f"got {spec!r}")


# -- the provider-independent functions, on a default processor -------------------------------
default = EventProcessor()
"""The processor the module-level functions use (an app with one set of streams needs no other)."""


def register_stream(name: str, schema: Mapping[str, Any], max_delay: Any = 0) -> None:
    default.register_stream(name, schema, max_delay)


def remove_stream(name: str) -> None:
    default.remove_stream(name)


def create_query(query_id: Any, definition: Any) -> None:
    default.create_query(query_id, definition)


def remove_query(query_id: Any) -> None:
    default.remove_query(query_id)


def add_output_processor(query_id: Any, fn: Callable[[dict], Any]) -> None:
    default.add_output_processor(query_id, fn)


def remove_output_processor(query_id: Any, fn: Callable) -> None:
    default.remove_output_processor(query_id, fn)


def push_event(stream: str, payload: Mapping[str, Any], ts: int) -> None:
    default.push_event(stream, payload, ts)

"""The application: a description of a graph of operators. Building one starts nothing.

Example::

    from pescheduler import Application

    app = Application("connected-cars")
    cars = app.source("generator", events=200_000, keys=1_000, seed=7)
    (cars
        .map(lambda e: {**e, "speed": e["speed"] / 3.6})
        .filter(lambda e: e["speed"] > 5)
        .key_by("car")
        .window(size="60s", aggregates={"avg_speed": ("avg", "speed")})
        .sink("jsonl", path="out/avg_speed.jsonl"))

Operator ids are the operator's name plus its position (``map-2``,
``window-5``) unless ``id=`` is given. Names are resolved against the
registered plug-ins when the app is deployed; a known operator checks its
parameters at once, so a misspelt argument fails on the line that wrote it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InvalidApplication


@dataclass
class OpNode:
    """One operator as the user wrote it: kind, registry name, parameters, inputs."""

    op_id: str
    kind: str                                   # "source" | "operator" | "sink"
    name: str
    params: dict
    inputs: list[tuple[str, str]] = field(default_factory=list)   # (upstream op_id, port)
    key_field: str | Callable | None = None     # key of the stream it reads, from key_by
    where: tuple[str, int] | None = None        # (file, line) of the app's code that added it


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _written_at() -> tuple[str, int] | None:
    """The file and line of the first caller outside pescheduler: where the app's author wrote the
    operator, so a check made later (an unknown name at deploy) points there."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None


class Application:
    """A named graph of operators, built with :meth:`source` and :class:`Stream` methods."""

    def __init__(self, name: str) -> None:
        if not name or not isinstance(name, str):
            raise InvalidApplication("Application needs a name, e.g. Application('connected-cars')")
        self.name = name
        self.nodes: dict[str, OpNode] = {}

    def source(self, name: str, *, id: str | None = None, **params: Any) -> "Stream":
        """Add a source by registry name (``generator``, ``iterable``, ``jsonl``, or a plug-in's)."""
        node = self._add("source", name, params, [], id)
        return Stream(self, node.op_id)

    def _add(self, kind: str, name: str, params: dict, inputs: list[tuple[str, str]],
             op_id: str | None, key_field: Any = None) -> OpNode:
        if op_id is None:
            op_id = f"{name}-{len(self.nodes) + 1}"
        if op_id in self.nodes:
            raise InvalidApplication(f"operator id {op_id!r} is used twice; give each id= a unique value")
        _check_params(kind, name, params)
        node = OpNode(op_id, kind, name, params, list(inputs), key_field, _written_at())
        self.nodes[op_id] = node
        return node

    def consumers(self, op_id: str) -> list[str]:
        """Operators reading any port of ``op_id``."""
        return [n.op_id for n in self.nodes.values() if any(src == op_id for src, _ in n.inputs)]

    def __repr__(self) -> str:
        return f"Application({self.name!r}, operators={list(self.nodes)})"


def _check_params(kind: str, name: str, params: dict) -> None:
    """Instantiate a known operator once so bad parameters fail where the app is written."""
    from ..plugins import active_plugins

    cls = active_plugins().operators.get((kind, name))
    if cls is None:
        return          # maybe provided by a --plugin module; checked again at deploy
    try:
        cls(**params)
    except (TypeError, ValueError) as exc:
        raise InvalidApplication(f"{kind} {name!r}: {exc}") from None


class Stream:
    """The output of one operator port; methods add the next operator and return its stream."""

    def __init__(self, app: Application, op_id: str, port: str = "out",
                 key_field: str | Callable | None = None) -> None:
        self.app = app
        self.op_id = op_id
        self.port = port
        self.key_field = key_field

    def apply(self, name: str, *, id: str | None = None, **params: Any) -> "Stream":
        """Add any registered operator by name; the shorthands below all come through here."""
        node = self.app._add("operator", name, params, [(self.op_id, self.port)], id, self.key_field)
        return Stream(self.app, node.op_id)

    def map(self, fn: Callable | None = None, *, id: str | None = None, columns: dict | None = None,
            **more: Any) -> "Stream":
        """``map(lambda t: ...)`` per tuple, or ``map(field=col(...) ...)``: fields set from
        expressions (``pescheduler.expr``), compiled into the fused loop and run on Arrow batches.
        A field called ``fn``, ``id``, ``name`` or ``columns`` goes in ``columns={...}``."""
        columns = {**(columns or {}), **more}
        params = {"columns": columns} if {"fn", "columns"} & set(columns) else dict(columns)
        if fn is not None:
            params["fn"] = fn
        node = self.app._add("operator", "map", params, [(self.op_id, self.port)], id, self.key_field)
        return Stream(self.app, node.op_id)          # not apply(): a field may be called name or id

    def filter(self, fn: Any, *, id: str | None = None) -> "Stream":
        """Keep tuples where ``fn(t)`` (a function) or an expression (``col("speed") > 5``) is true."""
        out = self.apply("filter", id=id, fn=fn)
        out.key_field = self.key_field      # filtering keeps tuples as they are, so the key holds
        return out

    def flat_map(self, fn: Callable, *, id: str | None = None) -> "Stream":
        return self.apply("flat_map", id=id, fn=fn)

    def key_by(self, field: str | Callable, *, id: str | None = None) -> "Stream":
        """Key the stream: the next keyed operator (window, join) groups by ``field``."""
        out = self.apply("key_by", id=id, field=field)
        out.key_field = field
        return out

    def window(self, size: Any = None, slide: Any = None, aggregates: dict | None = None, *,
               gap: Any = None, count: int | None = None, id: str | None = None,
               **params: Any) -> "Stream":
        """A window with aggregates; exactly one of ``size``, ``gap`` or ``count`` says which kind.

        ``size=`` (and ``slide=``): tumbling or sliding event-time windows
        (operators/window.py); ``size=`` with ``slide="event"``: a result per event over
        the ``size`` before it (operators/over_window.py); ``gap=``: session windows
        (operators/session.py);
        ``count=`` (and ``slide=`` in tuples): count windows (operators/count_window.py).
        """
        kinds = {"size": size, "gap": gap, "count": count}
        given = [k for k, v in kinds.items() if v is not None]
        if len(given) != 1:
            raise InvalidApplication(f"window: give exactly one of size= (time windows), gap= (sessions) "
                                     f"or count= (count windows); got {given or 'none'}")
        aggregates = aggregates or {}
        if gap is not None:
            if slide is not None:
                raise InvalidApplication("window: a session window (gap=) has no slide")
            return self.apply("session_window", id=id, gap=gap, aggregates=aggregates, **params)
        if count is not None:
            return self.apply("count_window", id=id, count=count, slide=slide, aggregates=aggregates,
                              **params)
        if slide == "event":
            return self.apply("over_window", id=id, size=size, aggregates=aggregates, **params)
        return self.apply("window", id=id, size=size, slide=slide, aggregates=aggregates, **params)

    def join(self, other: "Stream", within: Any, *, id: str | None = None, **params: Any) -> "Stream":
        """Window join with ``other``: pairs within ``within`` of each other, equal keys,
        ``predicate`` true; each reported once, when its newer event arrives (operators/join.py)."""
        node = self.app._add("operator", "join", {"within": within, **params},
                             [(self.op_id, self.port), (other.op_id, other.port)], id, self.key_field)
        return Stream(self.app, node.op_id)

    def join_asof(self, other: "Stream", by: str | Callable | None = None, *, on: str = "ts",
                  tolerance: Any = None, direction: str = "backward", id: str | None = None) -> "Stream":
        """As-of join with ``other``: each event with ``other``'s event of the same ``by`` key
        nearest before (``direction="backward"``), after or either side of its ``on`` time,
        within ``tolerance``; exact under out-of-order input (operators/join_asof.py)."""
        if by is None and self.key_field is None:
            raise InvalidApplication("join_asof needs a key: by=\"field\", or key_by(field) before it")
        params = {"by": by, "on": on, "tolerance": tolerance, "direction": direction}
        return self._keyed("join_asof", (other,), by, id, params)

    def join_interval(self, other: "Stream", by: str | Callable | None = None, *, lower: Any, upper: Any,
                      id: str | None = None, **params: Any) -> "Stream":
        """Interval join with ``other``: pairs of equal ``by`` key with ``l.ts + lower <= r.ts <=
        l.ts + upper`` (``lower="-5s", upper="0s"``), each reported once, when its newer event
        arrives; ``join(within=w)`` is its symmetric case (operators/join.py)."""
        if by is not None:
            params["on"] = by
        return self._keyed("join", (other,), by, id, {"lower": lower, "upper": upper, **params})

    def lookup(self, table: Any, key: str | Callable | None = None, *, table_key: str | None = None,
               as_of: bool = False, on: str = "ts", id: str | None = None) -> "Stream":
        """Enrich each event with its ``key``'s row of ``table``: a changelog ``Stream`` (CDC changes
        or a ``latest()``; ``as_of=True``: the row as of the event's time), an iterable of rows or a
        JSON-lines file's path (rows keyed by ``table_key``, default ``key``) (operators/lookup.py)."""
        key = self.key_field if key is None else key
        if key is None:
            raise InvalidApplication("lookup needs a key: key=\"field\", or key_by(field) before it")
        params = {"key": key, "as_of": as_of, "on": on}
        if not isinstance(table, Stream):
            kind = "path" if isinstance(table, (str, os.PathLike)) else "rows"
            params.update({kind: os.fspath(table) if kind == "path" else table, "table_key": table_key})
            return self._keyed("lookup", (), key, id, params)
        if table_key is not None and table_key != key:
            from ..expr import col

            table = table.map(columns={key: col(table_key)})   # both inputs carry the key copies route by
        return self._keyed("lookup", (table,), key, id, params)

    def _keyed(self, name: str, others: tuple, by: Any, id: str | None, params: dict) -> "Stream":
        """A KEYED operator of this stream (input 0) and ``others`` (inputs 1, ...), keyed by ``by``
        (default: this stream's key); every input is routed to its copies by that key."""
        key = self.key_field if by is None else by
        inputs = [(stream.op_id, stream.port) for stream in (self, *others)]
        node = self.app._add("operator", name, params, inputs, id, key)
        return Stream(self.app, node.op_id)

    def union(self, *others: "Stream", id: str | None = None) -> "Stream":
        """Every tuple of this stream and of ``others``, as they come (SQL's UNION ALL)."""
        inputs = [(stream.op_id, stream.port) for stream in (self, *others)]
        node = self.app._add("operator", "union", {}, inputs, id)
        return Stream(self.app, node.op_id)

    def pattern(self, pattern: str, define: dict, *, id: str | None = None, **params: Any) -> "Stream":
        """Sequential pattern over the stream, per key if keyed (operators/pattern.py)."""
        out = self.apply("pattern", id=id, pattern=pattern, define=define, **params)
        out.key_field = None
        return out

    def latest(self, *, id: str | None = None, **params: Any) -> "Stream":
        """The current row per key of a changelog (``postgres_cdc``): upserts and deletes of the
        state, each with the row it replaced (operators/latest.py)."""
        out = self.apply("latest", id=id, **params)
        key = params.get("key", self.key_field)
        out.key_field = key if isinstance(key, str) else None      # its rows carry a field key as it was
        return out

    def aggregate(self, aggregates: dict, *, by: str | None = None, id: str | None = None) -> "Stream":
        """Aggregates per ``by`` group (default: the preceding ``key_by``'s field) of a changelog's
        current rows, a ``latest()``'s changes: an update takes the old row back out and a delete
        retracts it; emits ``{"op": "upsert"|"delete", by: group, <aggregates>}`` per group changed
        (operators/changelog_aggregate.py)."""
        by = self.key_field if by is None else by
        if not isinstance(by, str):
            raise InvalidApplication("aggregate over a changelog needs a group field: by=\"region\", "
                                     "or key_by(\"region\") before it")
        split = self.apply("changelog_split", by=by)
        return split._keyed("changelog_aggregate", (), by, id, {"by": by, "aggregates": aggregates})

    def process(self, fn: type | str, *, ttl: Any = None, id: str | None = None, **params: Any) -> "Stream":
        """A keyed process function: ``fn(**params)`` gets ``on_event(event, ctx)`` and
        ``on_timer(ts, key, ctx)`` with per-key state and timers (operators/process.py); ``fn``
        a class, or the name a plug-in registered one under (``Process.named``)."""
        if self.key_field is None:
            raise InvalidApplication("process needs a keyed stream: call key_by(field) before process(...)")
        if isinstance(fn, str):
            return self.apply(fn, id=id, ttl=ttl, **params)
        return self.apply("process", id=id, fn=fn, params=params, ttl=ttl)

    def upstream(self) -> list[OpNode]:
        """The app's operators this stream reads from, its own included, in the order they were added."""
        nodes, reached, pending = self.app.nodes, set(), [self.op_id]
        while pending:
            op_id = pending.pop()
            if op_id not in reached:
                reached.add(op_id)
                pending.extend(src for src, _port in nodes[op_id].inputs)
        return [node for op_id, node in nodes.items() if op_id in reached]

    def late_events(self) -> "Stream":
        """The side output of events that arrived after their window fired."""
        return Stream(self.app, self.op_id, port="late")

    def sink(self, name: str, *, id: str | None = None, **params: Any) -> "Stream":
        """End the stream in a registered sink (``jsonl``, ``print``, or a plug-in's)."""
        node = self.app._add("sink", name, params, [(self.op_id, self.port)], id, self.key_field)
        return Stream(self.app, node.op_id)

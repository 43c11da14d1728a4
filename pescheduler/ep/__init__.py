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

Providers (``EventProcessor(provider=...)``): ``"native"`` (the default, the
project's operators in-process, ``native.py``), or a database through the SQL
bridge (``sql.py``): ``"sqlite"``, ``"duckdb"``, a URL such as
``"postgresql://..."``, or any DB-API 2.0 connection (``providers.py``). The
same calls give the same results on every provider; a database runs
predicates written as expressions (``ep.col``, ``ep.left``/``ep.right``,
``ep.measure``: ``expr.py``).

The package: ``schema.py`` (what a pushed event must look like), ``api.py``
(definitions and the processor's contract), ``native.py``, ``sql.py``,
``providers.py``, ``predicates.py``; ``api.py`` keeps the engines' registry
(``EventProcessor(provider)`` picks ``native.py``'s or ``sql.py``'s class by it).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .api import (Aggregate, CountWindow, Correlate, Definition, EventProcessor, Filter, Output, Pattern,
                  Session, Sliding, Stream, Tumbling, as_definition)
from .predicates import Expr, coalesce, col, left, lit, measure, right, when
from .native import NativeProcessor
from .sql import SQLProcessor  # noqa: F401  (registers the SQL engine)
from .schema import TS_FIELD, Schema, SchemaError

__all__ = ["Aggregate", "CountWindow", "Correlate", "Definition", "EventProcessor", "Expr", "Filter",
           "NativeProcessor", "Output", "Pattern", "Schema", "SchemaError", "Session", "Sliding", "Stream",
           "TS_FIELD", "Tumbling", "add_output_processor", "as_definition", "coalesce", "col", "when", "create_query", "default",
           "left", "lit", "measure", "push_event", "register_stream", "remove_output_processor",
           "remove_query", "remove_stream", "right"]


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

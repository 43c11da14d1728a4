"""Stateless built-ins: ``map``, ``filter``, ``flat_map``, ``key_by``.

Each handles a whole batch with one comprehension or C-level call and catches
nothing: when a user function raises, the chain re-runs that batch tuple by
tuple and dead-letters only the tuples that fail (``Chain._isolate``), which
is safe because these operators keep no state.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from pescheduler.operator import Emitter, Operator, Parallelism


def _callable(op: str, fn: Any) -> Callable:
    if not callable(fn):
        raise TypeError(f"{op}: fn must be callable, got {fn!r}")
    return fn


class Map(Operator):
    """``fn(t)`` for every tuple: ``stream.map(lambda e: {**e, "speed": e["speed"] / 3.6})``."""

    name = "map"
    parallelism = Parallelism.STATELESS

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = _callable("map", fn)

    def process(self, batch: list, emit: Emitter) -> None:
        emit.many(map(self.fn, batch))


class Filter(Operator):
    """Keep the tuples for which ``fn(t)`` is true: ``stream.filter(lambda e: e["speed"] > 5)``."""

    name = "filter"
    parallelism = Parallelism.STATELESS

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = _callable("filter", fn)

    def process(self, batch: list, emit: Emitter) -> None:
        emit.many(filter(self.fn, batch))


class FlatMap(Operator):
    """Emit every item of ``fn(t)`` (an iterable): ``stream.flat_map(lambda line: line.split())``."""

    name = "flat_map"
    parallelism = Parallelism.STATELESS

    def __init__(self, fn: Callable[[Any], Iterable[Any]]) -> None:
        self.fn = _callable("flat_map", fn)

    def process(self, batch: list, emit: Emitter) -> None:
        fn = self.fn
        emit.many([item for t in batch for item in fn(t)])


class KeyBy(Operator):
    """Mark the stream as keyed by ``field`` (a field name or a callable of the tuple).

    Tuples pass through unchanged; the compiler hands ``field`` to the KEYED
    operator that follows (``context.key_field``), and routing between copies
    hashes it.
    """

    name = "key_by"
    parallelism = Parallelism.STATELESS

    def __init__(self, field: str | Callable[[Any], Any]) -> None:
        if not (isinstance(field, str) or callable(field)):
            raise TypeError(f"key_by: field must be a field name or a callable, got {field!r}")
        self.field = field

    def process(self, batch: list, emit: Emitter) -> None:
        emit.many(batch)

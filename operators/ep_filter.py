"""Every filter-only ``pescheduler.ep`` query of one stream in one operator.

The JEPC workload runs Count queries of one shape side by side (``a - b ==
i`` for i = 1..Count). As one ``filter`` operator each, an event crosses
Count operators and Count output sinks; here it crosses one. Queries whose
predicate is (or has as a conjunct) ``expression == literal`` share the
expression: it is computed once per event and the literal looked up in a
dict of the queries waiting for that value, so an event costs one lookup,
not Count tests (the rest of each predicate is tested on the queries found).
Other predicates are tested one by one.

``ep_filter(queries={query_id: [predicate, ...]})`` emits ``(query_id, event)``
for each query all of whose predicates hold, in the order events came, for
a tagged ``ep_output``. Queries come and go (``add_query`` / ``remove_query``).
A predicate that raises dead-letters ``{"query", "event"}`` for that query alone.
"""

from __future__ import annotations

from typing import Any, Callable

from pescheduler.expr import Binary, Expr, Lit, conjuncts
from pescheduler.operator import Emitter, Operator, Parallelism


def _split(predicates: list) -> tuple[Expr | None, Any, list[Callable]]:
    """``(shared expression, literal, rest)``: the first ``expr == literal`` conjunct, and the rest."""
    rest: list = []
    found = None
    for p in predicates:
        parts = conjuncts(p) if isinstance(p, Expr) else [p]
        for c in parts:
            if found is None and isinstance(c, Binary) and c.op == "eq":
                e, lit = (c.left, c.right) if isinstance(c.right, Lit) else (c.right, c.left)
                if isinstance(lit, Lit) and not isinstance(e, Lit) and _indexable(lit.value):
                    found = (e, lit.value)
                    continue
            rest.append(c.function() if isinstance(c, Expr) else c)
    return (found[0], found[1], rest) if found else (None, None, rest)


def _indexable(value: Any) -> bool:
    """A literal a dict finds exactly as ``==`` does (not null, not NaN)."""
    return isinstance(value, (int, str)) or (isinstance(value, float) and value == value)


class SharedFilter(Operator):
    """Filter-only queries of one stream; see the module docstring."""

    name = "ep_filter"
    parallelism = Parallelism.STATELESS

    def __init__(self, queries: dict) -> None:
        self._queries: dict[Any, list] = {}
        for query_id, predicates in queries.items():
            self._queries[query_id] = list(predicates)
        self._compile()

    def parameters(self) -> dict:
        return {"queries": {q: list(p) for q, p in self._queries.items()}}

    @property
    def query_ids(self) -> list:
        return list(self._queries)

    def add_query(self, query_id: Any, predicates: list) -> None:
        self._queries[query_id] = list(predicates)
        self._compile()

    def remove_query(self, query_id: Any) -> None:
        del self._queries[query_id]
        self._compile()

    def _compile(self) -> None:
        """Group queries by their shared expression (``repr``: structural equality)."""
        groups: dict[str, tuple[Callable, dict]] = {}
        self._plain: list[tuple[Any, list]] = []
        for query_id, predicates in self._queries.items():
            e, value, rest = _split(predicates)
            if e is None:
                self._plain.append((query_id, rest))
                continue
            fn, index = groups.setdefault(repr(e), (e.function(), {}))
            index.setdefault(value, []).append((query_id, rest))
        self._groups = list(groups.values())

    def process(self, batch: list, emit: Emitter) -> None:
        groups, plain = self._groups, self._plain
        for e in batch:
            for fn, index in groups:
                try:
                    found = index.get(fn(e))
                except Exception as exc:
                    for waiting in index.values():
                        for query_id, _ in waiting:
                            emit.dead_letter({"query": query_id, "event": e}, exc)
                    continue
                if found:
                    self._test(e, found, emit)
            if plain:
                self._test(e, plain, emit)

    @staticmethod
    def _test(e: dict, candidates: list, emit: Emitter) -> None:
        for query_id, rest in candidates:
            try:
                if all(p(e) for p in rest):
                    emit.append((query_id, e))      # (emit(...) is a slower call)
            except Exception as exc:
                emit.dead_letter({"query": query_id, "event": e}, exc)

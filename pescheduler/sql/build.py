"""A :class:`~pescheduler.sql.plan.QueryPlan` as operators on the source's ``Stream``.

Each step is an ordinary operator of the app (``filter``/``map`` with ``col``
expressions, ``key_by``, ``window``), so a query fuses, runs on Arrow batches
where the columnar path applies, and is copied, moved and checkpointed like a
hand-written app. The one per-row Python call is the final projection, which
keeps only the SELECT's fields (a map with expressions adds fields, it never
drops any); it is left out when a window's rows already hold exactly those
(then in the window's order: a row is a dict, its fields are found by name).
"""

from __future__ import annotations

from typing import Any, Iterable

from ..expr import Binary, Expr, Unary, col
from ..plan.app import Stream
from .plan import WINDOW_FIELDS, QueryPlan


class Projection:
    """``t -> {name: t[name] for name in names}``: SELECT's fields, in its order (picklable; a
    per-row call, which only SELECTs that drop or rename fields pay)."""

    def __init__(self, names: list[str]) -> None:
        self.names = tuple(names)

    def __call__(self, t: dict) -> dict:
        return {name: t[name] for name in self.names}

    def __repr__(self) -> str:
        return f"Projection({', '.join(self.names)})"


def build(plan: QueryPlan, stream: Stream) -> Stream:
    """The operators of ``plan`` appended to ``stream`` (the source it reads)."""
    where = reused(plan.where, plan.inputs) if plan.where is not None and plan.inputs else None
    if where is not None:          # WHERE reads what an aggregate's input computes: compute it once
        stream = stream.map(columns=plan.inputs).filter(where)
    else:
        if plan.where is not None:
            stream = stream.filter(plan.where)
        if plan.inputs:
            stream = stream.map(columns=plan.inputs)
    if plan.window is not None:
        stream = _window(plan, stream)
    if plan.computed:
        stream = stream.map(columns=plan.computed)
    if _fields_after(plan) != set(plan.columns):
        stream = stream.map(Projection(plan.columns))
    return stream


def reused(where: Expr, inputs: dict[str, Expr]) -> Expr | None:
    """``where`` reading the hidden fields of ``inputs`` in place of the sub-trees they compute
    (``WHERE speed / 3.6 > 5`` with ``AVG(speed / 3.6)``: ``_in0 > 5``), or None if it has none.

    Then the map goes before the filter and the division runs once per row, as in the app
    written by hand. Only sub-trees the filter always evaluates are replaced (not inside a
    ``when``/``coalesce``, which evaluate lazily): a row the map fails was one the filter failed.
    """
    names = {repr(e): name for name, e in inputs.items()}

    def walk(e: Expr) -> Expr:
        if repr(e) in names:
            return col(names[repr(e)])
        if isinstance(e, Binary):
            return Binary(e.op, walk(e.left), walk(e.right))
        if isinstance(e, Unary):
            return Unary(e.op, walk(e.operand))
        return e
    replaced = walk(where)
    return None if replaced.same(where) else replaced


def _window(plan: QueryPlan, stream: Stream) -> Stream:
    if plan.key is not None:
        stream = stream.key_by(plan.key)
    stream = stream.window(aggregates=plan.aggregates, **plan.window.params())
    return stream.filter(plan.having) if plan.having is not None else stream


def _fields_after(plan: QueryPlan) -> set[str] | None:
    """The fields rows have before the projection, when known (a window's rows; else None)."""
    if plan.window is None:
        return None
    return {plan.key, *WINDOW_FIELDS, *plan.aggregates, *plan.computed} - {None}


def describe(nodes: Iterable) -> list[dict[str, Any]]:
    """Operator nodes (``stream.upstream()``, ``app.nodes.values()``), source first: id, name,
    inputs, parameters (EXPLAIN)."""
    return [{"id": node.op_id, "operator": node.name, "inputs": [s for s, _ in node.inputs], "params": node.params}
            for node in nodes]

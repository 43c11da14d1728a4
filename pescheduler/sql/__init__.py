"""Streaming SQL: a query over named streams, compiled to the app's own operators.

>>> from pescheduler import Application
>>> from pescheduler.sql import sql
>>> app = Application("cars")
>>> cars = app.source("iterable", items=[{"car": "a", "speed": 10.0, "ts": 1_000}])
>>> fast = sql("SELECT car, speed * 3.6 AS kmh FROM cars WHERE speed > 5", sources={"cars": cars})

Three steps, one module each: :mod:`.parse` (text to a sqlglot tree, errors
placed at line and column), :mod:`.plan` (a SELECT to a :class:`QueryPlan`,
checking every clause), :mod:`.build` (the plan as ``filter``/``map``/
``key_by``/``window`` operators with ``col`` expressions). Pure: nothing here
runs anything; the returned ``Stream`` is deployed like any other. The
supported grammar is in docs/sql.md.
"""

from __future__ import annotations

import sys
import types
from typing import Iterable, Mapping

from sqlglot import exp

from ..plan.app import Application, Stream
from .build import build, describe
from .joins import joined
from .parse import SQLError, error, parse
from .plan import plan_select

__all__ = ["SQLError", "explain", "explain_app", "sql"]


def sql(query: str, sources: Mapping[str, Stream]) -> Stream:
    """``query`` (a SELECT, or SELECTs joined by UNION ALL) over ``sources`` as a ``Stream``."""
    return _stream(parse(query), query, sources)


def explain(query: str, sources: Mapping[str, Stream], workers: int = 1) -> str:
    """What ``EXPLAIN`` shows: the operators ``query`` compiles to, one a line, source first,
    then the PEs the planner fuses them into on ``workers`` workers (:func:`placement_lines`)."""
    stream = sql(query, sources)
    return "\n".join(operator_lines(stream.upstream()) + placement_lines(stream.app, workers))


def operator_lines(nodes: Iterable) -> list[str]:
    """One line per operator node: ``id: name(params) <- inputs`` (an iterable's items left out)."""
    lines = []
    for op in describe(nodes):
        params = ", ".join(f"{k}={v!r}" for k, v in op["params"].items() if k != "items")
        lines.append(f"{op['id']}: {op['operator']}({params}) <- {', '.join(op['inputs']) or '-'}")
    return lines


def placement_lines(app: Application, workers: int = 1) -> list[str]:
    """The placement ``pescheduler.deploy`` would start ``app`` with on ``workers`` workers, from
    the planner itself (``plan.compiler.compile_app``: pure, no cluster): one line per PE, its
    operators in order and its worker. ``app`` is copied, and each stream of it whose result goes
    nowhere yet (a query's not sunk yet) given a ``print`` sink (``explain-sink``) so the planner
    accepts it; the caller's app is left as it was."""
    import copy

    from ..plan.compiler import compile_app
    from ..plugins import active_plugins

    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    app = copy.deepcopy(app)
    ends = [op_id for op_id, node in app.nodes.items() if node.kind != "sink" and not app.consumers(op_id)]
    for i, op_id in enumerate(ends):
        Stream(app, op_id).sink("print", id="explain-sink" + (f"-{i + 1}" if len(ends) > 1 else ""))
    names = [f"worker-{i}" for i in range(workers)]
    placed = compile_app(app, active_plugins(), names, {w: "" for w in names})
    lines = [f"placement on {workers} worker(s): {len(placed.pes)} PE(s)"]
    for pe in placed.pes.values():
        lines.append(f"  {pe.worker}: [{' + '.join(pe.operators)}]")
    return lines


def explain_app(app: Application, workers: int = 1) -> str:
    """``EXPLAIN`` of a whole app (``deploy app.sql --explain``): every operator, then the placement."""
    return "\n".join(operator_lines(app.nodes.values()) + placement_lines(app, workers))


def _stream(tree: exp.Expression, query: str, sources: Mapping[str, Stream]) -> Stream:
    if isinstance(tree, exp.Union):
        return _union(tree, query, sources)
    plan = plan_select(tree, query)
    stream = _source(plan.source, tree, query, sources)
    if plan.join is not None:
        stream = joined(plan.join, stream, _source(plan.join.sources[1], tree, query, sources))
    return build(plan, stream)


def _union(tree: exp.Union, query: str, sources: Mapping[str, Stream]) -> Stream:
    if tree.args.get("distinct"):
        raise error(query, tree, f"{tree.key.upper()} is not supported: only UNION ALL (a stream "
                                 f"cannot be deduplicated without a window)")
    left, right = _stream(tree.this, query, sources), _stream(tree.expression, query, sources)
    names = [_columns(tree.this, query), _columns(tree.expression, query)]
    if names[0] != names[1]:
        raise error(query, tree.expression, f"UNION ALL's SELECTs name different fields: {names[0]} "
                                            f"and {names[1]} (give them the same names, in the same order)")
    return left.union(right)


def _columns(tree: exp.Expression, query: str) -> list[str]:
    return _columns(tree.this, query) if isinstance(tree, exp.Union) else plan_select(tree, query).columns


def _source(name: str, tree: exp.Expression, query: str, sources: Mapping[str, Stream]) -> Stream:
    if name not in sources:
        named = (n for n in tree.find_all(exp.Column, exp.Table) if n.name == name)
        node = next(named, next(tree.args["from_"].find_all(exp.Column, exp.Table)))
        raise error(query, node, f"unknown source {name!r}; known: {', '.join(sorted(sources)) or 'none'}")
    return sources[name]


class _CallableModule(types.ModuleType):
    """This module, callable: ``pescheduler.sql(query, sources)`` is :func:`sql`."""

    def __call__(self, query: str, sources: Mapping[str, Stream]) -> Stream:
        return sql(query, sources)


sys.modules[__name__].__class__ = _CallableModule

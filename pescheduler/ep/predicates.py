"""EP predicates: the project's one expression tree, plus the sides an EP query reads and SQL.

A Python lambda is opaque: only Python can call it. A query that should run
inside a database (``EventProcessor(provider="sqlite")``, ...) writes its
predicates as expressions instead::

    from pescheduler import ep

    hot = (ep.col("a") - ep.col("b") == 1) & (ep.col("id") != "s0")
    assert hot({"id": "s1", "a": 3, "b": 2})                    # Python, on the native engine
    near = ep.left("a") - ep.right("b") == 2                    # a correlation: both sides
    assert near({"a": 5}, {"b": 3})
    rise = ep.col("a") - ep.measure("z") == 1                   # a pattern symbol: event and measures
    assert rise({"a": 4}, {"z": 3})

The nodes, operators, null rules, pickling and the compiled Python callable are
those of :mod:`pescheduler.expr` (``ep.col`` *is* ``pescheduler.col``): nulls
propagate, ``&``/``|``/``~`` are SQL's three-valued logic, ``/`` is true
division, ``%`` Python's floor modulo, and dividing by zero gives null on the
native engine as on every database. This module adds only what EP needs on
top: :func:`left`, :func:`right`, :func:`measure` (columns of other sides) and
:func:`to_sql`, the SQL backend (every literal a bound parameter; the dialect
writes division and modulo so that they match Python's; a string function is
written so that it matches :mod:`pescheduler.strings`, or refused on that database
with :class:`pescheduler.strings.Unsupported` naming it).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ..expr import BINARY, Binary, Col, Expr, Func, Lit, Unary, Visitor, coalesce, col, conjuncts, lift, lit, when

__all__ = ["IDENTIFIER", "Col", "Expr", "coalesce", "col", "conjuncts", "left", "lift", "lit", "measure", "right",
           "to_sql", "when"]

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_SQL = {**BINARY, "eq": "=", "ne": "<>", "and": "AND", "or": "OR"}   # what SQL spells differently


def left(name: str) -> Col:
    """In a correlation predicate: the field ``name`` of the left event."""
    return Col(name, "left")


def right(name: str) -> Col:
    """In a correlation predicate: the field ``name`` of the right event."""
    return Col(name, "right")


def measure(name: str) -> Col:
    """In a pattern: the measure ``name`` of the run (set by ``do``)."""
    return Col(name, "measure")


class _Sql(Visitor):
    """SQL text; literals go to ``params`` in the order their placeholders appear."""

    def __init__(self, column: Callable[[Col], str], dialect: Any, params: list) -> None:
        self.column, self.dialect, self.params = column, dialect, params

    def visit(self, e: Expr) -> Any:
        if isinstance(e, Binary) and e.op == "mod":   # floor_mod writes a once, then b three times
            a = self.visit(e.left)
            mark = len(self.params)
            b = self.visit(e.right)
            self.params.extend(self.params[mark:] * 2)
            return self.dialect.floor_mod(a, f"NULLIF({b}, 0)")
        if isinstance(e, Func):          # SUBSTRING's positions are written as numbers, not bound
            from ..strings import to_sql as string_sql

            literals = [a.value if isinstance(a, Lit) else ... for a in e.args]
            shown = e.args[:1] if e.name == "substring" else e.args
            return string_sql(e.name, [self.visit(a) for a in shown], literals, self.dialect.name)
        return super().visit(e)

    def col(self, e: Col) -> str:
        return self.column(e)

    def lit(self, e: Lit) -> str:
        self.params.append(e.value)
        return self.dialect.param(e.value)

    def binary(self, e: Binary, a: str, b: str) -> str:
        if e.op == "div":
            return f"({self.dialect.real(a)} / NULLIF({b}, 0))"
        return f"({a} {_SQL[e.op]} {b})"

    def when(self, e: Any) -> str:
        """``CASE WHEN``: a null condition is not true, as in the tree; parts in textual order,
        so the parameters follow their placeholders."""
        cases = " ".join(f"WHEN {self.visit(c)} THEN {self.visit(v)}" for c, v in e.cases)
        return f"(CASE {cases} ELSE {self.visit(e.default)} END)"

    def coalesce(self, e: Any) -> str:
        return f"COALESCE({', '.join(self.visit(a) for a in e.args)})"

    def unary(self, e: Unary, x: str) -> str:
        return {"neg": f"(-{x})", "not": f"(NOT {x})", "abs": f"ABS({x})",
                "is_null": f"({x} IS NULL)", "is_not_null": f"({x} IS NOT NULL)"}[e.op]


def to_sql(expr: Expr, column: Callable[[Col], str], dialect: Any, params: list) -> str:
    """SQL text for ``expr``; literals are appended to ``params`` and written as placeholders.

    ``column(c)`` names the column a :class:`Col` reads (raising for one the
    database cannot see, e.g. a pattern measure); ``dialect`` gives the
    placeholder and the division and modulo that match Python's.
    """
    return _Sql(column, dialect, params).visit(expr)

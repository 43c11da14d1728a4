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
writes division and modulo so that they match Python's).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ..expr import BINARY, Binary, Col, Expr, Lit, Unary, Visitor, col, conjuncts, lift, lit

__all__ = ["IDENTIFIER", "Col", "Expr", "col", "conjuncts", "equi_keys", "left", "lift", "lit", "measure", "right",
           "to_sql"]

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


# -- equal keys hidden in a correlation predicate ---------------------------------------------------
def _terms(e: Expr, sign: int, out: list) -> None:
    """``e`` as a signed sum: ``[(sign, term)]`` through ``+`` and ``-``."""
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        _terms(e.left, sign, out)
        _terms(e.right, sign if e.op == "add" else -sign, out)
    else:
        out.append((sign, e))


def _sum(terms: list, side: str) -> Expr:
    """The signed ``terms`` added up, columns read from one event (a join key reads one side)."""
    total: Expr | None = None
    for sign, t in terms:
        t = _one_side(t, side)
        if total is None:
            total = t if sign > 0 else -t
        else:
            total = total + t if sign > 0 else total - t
    return total


def _one_side(e: Expr, side: str) -> Expr:
    if isinstance(e, Col):
        return Col(e.name) if e.side == side else e
    if isinstance(e, Binary):
        return Binary(e.op, _one_side(e.left, side), _one_side(e.right, side))
    if isinstance(e, Unary):
        return Unary(e.op, _one_side(e.operand, side))
    return e


def equi_keys(predicate: Expr, types: Callable[[str, str], Any]) -> tuple[Expr, Expr] | None:
    """``(left_key, right_key)`` with ``predicate`` true only where the keys are equal, or None.

    A conjunct ``L1 ± R1 ± c == ...`` whose terms each read one side (or none)
    is an equation ``sum(left terms) + c == -sum(right terms)``: each side's
    key is one expression over its own event, so a join looks pairs up by hash
    instead of testing every pair (``ep.left("a") - ep.right("b") == 2`` keys
    ``a - 2`` against ``b``). Columns of side ``measure`` count as constants
    (the SQL bridge's parameter table: a correlation has no measures). Only over ``int`` fields and ``int`` literals
    (``types(side, field)``), where moving a term across ``==`` is exact; the
    predicate itself is still tested on the pairs found.
    """
    for c in conjuncts(predicate):
        if not (isinstance(c, Binary) and c.op == "eq"):
            continue
        terms: list = []
        _terms(c.left, 1, terms)
        _terms(c.right, -1, terms)
        sides: dict[str, list] = {"left": [], "right": [], "const": []}
        for sign, t in terms:
            refs = t.refs()
            if not all(types(side, name) is int for side, name in refs) or not all(
                    _exact(n) for n in _nodes(t)):
                break
            which = {side for side, _ in refs if side != "measure"}   # the SQL bridge's parameters
            if not which:
                sides["const"].append((sign, t))
            elif len(which) == 1 and which <= {"left", "right"}:
                sides[which.pop()].append((sign, t))
            else:
                break
        else:
            if sides["left"] and sides["right"]:
                return (_sum(sides["left"] + sides["const"], "left"),
                        _sum([(-sign, t) for sign, t in sides["right"]], "right"))
    return None


def _exact(e: Expr) -> bool:
    """A node of integer arithmetic (never null, never rounded, over int fields)."""
    if isinstance(e, Lit):
        return type(e.value) is int
    if isinstance(e, Binary):
        return e.op in ("add", "sub", "mul")
    if isinstance(e, Unary):
        return e.op in ("neg", "abs")
    return isinstance(e, Col)


def _nodes(e: Expr) -> list[Expr]:
    found, stack = [], [e]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children())
    return found

"""An EP query's lambda predicate as a ``col`` expression, where the streams' schemas make them agree.

Why: ``correlate("t", lambda l, r: l["a"] - r["b"] == 2)`` is how a Python
user writes a correlation; as a call it tests every pair of the window,
while the same predicate written with ``ep.left``/``ep.right`` becomes a
hash probe (``expr.equi_keys``) and runs on the SQL providers. A lambda
lifted (``pescheduler.lift``) has Python's semantics, ``col`` expressions
SQL's null rules; they agree where no value is None and nothing raises. A
schema guarantees every field present and of its type, never None
(``schema.Schema``), so a lifted predicate is turned into a ``col`` tree
when every node is typed and exact for those types: ``+ - *`` of numbers,
``/`` and ``%`` by a non-zero literal (``%`` of ints), comparisons of two
numbers or two values of one type, ``and``/``or``/``not`` of bools, ``-``,
``abs``. Anything else keeps the lambda, called as before.
"""

from __future__ import annotations

from typing import Any, Callable

from ..expr import Binary, Col, Expr, Lit, Py, Unary
from ..inline import NotProvable
from ..lift import lift_expression

_NUMBER = (int, float)
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "mod": "mod", "eq": "eq", "ne": "ne",
           "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "and": "and", "or": "or"}


def as_expression(fn: Any, sides: tuple[str, ...], types: Callable[[str, str], Any]) -> Expr | None:
    """``fn`` as a ``col`` expression meaning exactly what calling it means on events of the
    schemas ``types(side, field)`` describes (None where it may not)."""
    if not callable(fn) or isinstance(fn, Expr):
        return None
    try:
        tree = lift_expression(fn, sides)
        return _Typed(types).convert(tree)[0]
    except NotProvable:
        return None


class _Typed:
    """Converts a :class:`Py` tree node by node, each with its Python type; NotProvable where the
    ``col`` node could differ."""

    def __init__(self, types: Callable[[str, str], Any]) -> None:
        self.types = types

    def convert(self, e: Expr) -> tuple[Expr, type]:
        if isinstance(e, Col):
            t = self.types(e.side, e.name)
            if t not in (int, float, str, bool):
                raise NotProvable(f"{e!r} has no type in the schema")
            return e, t
        if isinstance(e, Lit):
            if e.value is None:
                raise NotProvable("None")
            return e, type(e.value)
        return self._py(e)

    def _py(self, e: Py) -> tuple[Expr, type]:
        args = [self.convert(a) for a in e.args]
        kinds = [t for _, t in args]
        nodes = [n for n, _ in args]
        op = e.op
        if op in ("and", "or", "not", "truth"):
            self._need(all(t is bool for t in kinds), op)
            if op == "truth":
                return nodes[0], bool
            if op == "not":
                return Unary("not", nodes[0]), bool
            out = nodes[0]
            for n in nodes[1:]:
                out = Binary(op, out, n)
            return out, bool
        if op in ("neg", "abs"):
            self._need(kinds[0] in _NUMBER, op)
            return Unary(op, nodes[0]), kinds[0]
        if op not in _BINARY:
            raise NotProvable(op)
        return self._binary(op, nodes, kinds, e.args[1])

    def _binary(self, op: str, nodes: list, kinds: list, right: Expr) -> tuple[Expr, type]:
        numbers = all(t in _NUMBER for t in kinds)
        node = Binary(op, *nodes)
        if op in ("eq", "ne"):
            self._need(numbers or kinds[0] is kinds[1], op)
            return node, bool
        if op in ("lt", "le", "gt", "ge"):
            self._need(numbers or kinds == [str, str], op)
            return node, bool
        self._need(numbers, op)
        if op in ("div", "mod"):
            self._need(isinstance(right, Lit) and right.value != 0, f"{op} by what may be 0")
            self._need(op == "div" or kinds == [int, int], "% of floats")
            return node, float if op == "div" else int
        return node, int if kinds == [int, int] else float

    @staticmethod
    def _need(ok: bool, what: str) -> None:
        if not ok:
            raise NotProvable(what)

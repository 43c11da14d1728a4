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
``abs``, ``in``/``not in`` a tuple of literals (an ``or`` of equations). Anything
else keeps the lambda, called as before.

A pattern's lambdas (``define``: ``lambda e, m: ...``, ``do``: ``lambda e, m:
{"z": ...}``) read the run's measures too, and ``m["z"]`` raises where a
measure is missing while ``ep.measure("z")`` is null. So they are lifted only
in a pattern that is a plain sequence of distinct symbols (``"x y u"``), where
every symbol is reached through all the ones before it: a measure is known
present, and of its type, once a lifted ``do`` of an earlier symbol set it
(:func:`lift_pattern`). A ``do`` kept as a call may set anything: after it no
measure is known.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Callable, Mapping

from ..expr import Binary, Col, Expr, Lit, Py, Unary
from ..inline import NotProvable
from ..lift import lift_assignments, lift_expression

_NUMBER = (int, float)
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "mod": "mod", "eq": "eq", "ne": "ne",
           "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "and": "and", "or": "or"}


def as_expression(fn: Any, sides: tuple[str, ...], types: Callable[[str, str], Any],
                  why: list[str] | None = None) -> Expr | None:
    """``fn`` as a ``col`` expression meaning exactly what calling it means on events of the
    schemas ``types(side, field)`` describes (None where it may not, and ``why`` gets the reason)."""
    if not callable(fn) or isinstance(fn, Expr):
        return None
    try:
        tree = lift_expression(fn, sides)
        return _Typed(types).convert(tree)[0]
    except NotProvable as exc:
        if why is not None:
            why.append(_reason(exc))
        return None


def _reason(exc: NotProvable) -> str:
    text = str(exc)
    return text if " " in text else f"`{text}` has no exact expression for these types"


def lift_pattern(step: Any, types: Callable[[str], Any], notes: list[str] | None = None) -> Any:
    """The ``ep.Pattern`` ``step`` with each lambda of ``define`` and ``do`` an expression where
    that is exact (see the module docstring); ``types(field)``: the event's schema; ``notes``
    gets one line per function kept as a call, saying why."""
    notes = [] if notes is None else notes
    symbols = step.pattern.split()
    if not re.fullmatch(r"\s*\w+(\s+\w+)*\s*", step.pattern) or len(set(symbols)) != len(symbols):
        if any(callable(f) and not isinstance(f, Expr) for f in (*step.define.values(), *(step.do or {}).values())):
            notes.append(f"pattern {step.pattern!r} is not a plain sequence of distinct symbols "
                         f"(a measure may be unset where a lambda reads it): its lambdas are called")
        return step                            # +, *, ?, |: a measure may be unset when read
    define, do = dict(step.define), dict(step.do or {})
    measures: dict[str, type] = {}             # set by every run that reaches the next symbol

    def read(side: str, name: str) -> Any:
        return types(name) if side == "event" else measures.get(name)
    for s in symbols:
        why: list[str] = []
        expr = as_expression(define.get(s), ("event", "measure"), read, why)
        define[s] = define.get(s) if expr is None else expr
        notes.extend(f"define[{s!r}] is called: {w}" for w in why)
        assign, why = do.get(s), []
        if assign is None:
            continue
        fields = as_assignments(assign, read, why) if callable(assign) and not isinstance(assign, Expr) else None
        notes.extend(f"do[{s!r}] is called: {w}" for w in why)
        if fields is None:
            measures.clear()                   # a call, or expressions with null semantics: types unknown
            continue
        do[s] = {name: e for name, (e, _) in fields.items()}
        measures.update((name, t) for name, (_, t) in fields.items())
    return replace(step, define=define, do=do if step.do is not None else None)


def as_assignments(fn: Any, types: Callable[[str, str], Any],
                   why: list[str] | None = None) -> dict[str, tuple[Expr, type]] | None:
    """A pattern ``do`` lambda ``lambda e, m: {"z": ...}`` as ``{"z": (col expression, its type)}``
    where each value means exactly what the call gives (None where it may not; ``why``: the reason)."""
    if isinstance(fn, Mapping):
        return None
    try:
        typed = _Typed(types)
        return {name: typed.convert(e) for name, e in lift_assignments(fn, ("event", "measure")).items()}
    except NotProvable as exc:
        if why is not None:
            why.append(_reason(exc))
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
                raise NotProvable(f"{e!r} is not set by a lifted do of every symbol before" if e.side == "measure"
                                  else f"{e!r} has no type in the schema")
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
        if op in ("in", "not_in"):
            return self._in(op, nodes, kinds, e.args[1:])
        if op not in _BINARY:
            raise NotProvable(op)
        return self._binary(op, nodes, kinds, e.args[1])

    def _in(self, op: str, nodes: list, kinds: list, items: tuple) -> tuple[Expr, type]:
        """``x in (a, b)``: Python compares with ``==`` item by item, so it is ``x == a or x == b`` (each
        equation exact for its types, as any other; ``x`` is never None: no identity shortcut to miss)."""
        self._need(len(nodes) > 1, f"{op} an empty tuple")
        out = None
        for node, kind, item in zip(nodes[1:], kinds[1:], items):
            eq = self._binary("eq", [nodes[0], node], [kinds[0], kind], item)[0]
            out = eq if out is None else Binary("or", out, eq)
        return (out if op == "in" else Unary("not", out)), bool

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

"""A map's or filter's lambda lifted to the expression tree ``col`` builds.

Why: ``stream.map(lambda e: {**e, "speed": e["speed"] / 3.6})`` is how a
Python user writes it; as a call per tuple it runs only on rows, at a Python
call's cost. Lifted to an expression it gets what ``col`` expressions get:
the fused loop (``expr.compile_rows``), Arrow kernels on columnar batches.
Polars only warns that a lambda could have been an expression; this
compiles it.

When: only when the tree provably means what the lambda does. The lambda
must be proven to be its own source (``inline.proven``: byte-identical code,
reading only its parameter, literals and unshadowed builtins), and its body
made only of field reads ``e["name"]``, int/float/str/bool/None literals,
``+ - * / %``, comparisons (chains included), ``and``/``or``/``not``, unary
``-``, ``abs()``, ``is (not) None``, ``in``/``not in`` a tuple or list of
literals, and for a map a dict display with string keys (``{**e, "k": ...}``
keeps ``e``'s fields, ``{"k": ...}`` only its own). The tree is made of
:class:`~pescheduler.expr.Py` nodes, which keep Python's semantics (None
arithmetic raises, a zero divisor raises, ``and`` short-circuits): a row the
lambda dead-letters is dead-lettered by the lifted map too, from the user's
function (``exact_arrow``). Anything else stays a Python call, and
:func:`why_not` says why (the deployment's status shows it once per operator).
"""

from __future__ import annotations

import ast
import math
from typing import Any

from .expr import Col, Expr, Lit, Py
from .inline import NotProvable, builtins_read, cell_constants, proven

_ARITHMETIC = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Mod: "mod"}
_COMPARE = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge",
            ast.In: "in", ast.NotIn: "not_in"}


def lift_steps(kind: str, fn: Any) -> tuple:
    """The ``compile_rows`` steps ``kind`` ("map" or "filter") of ``fn`` means, as expressions;
    :class:`~pescheduler.inline.NotProvable` when they would not provably mean the same."""
    body, lifter = _proven(fn, ("event",))
    if kind == "filter":
        tree = lifter.expr(body)
        return (("where", tree if isinstance(tree, Py) else Py("truth", tree)),)
    if not isinstance(body, ast.Dict):
        raise NotProvable("it returns no dict display ({...})")
    return (lifter.dict(body),)


def lift_expression(fn: Any, sides: tuple[str, ...]) -> Expr:
    """The body of the lambda ``fn`` as a tree of :class:`Py` nodes, its parameters reading
    ``sides`` in order (``("left", "right")`` for an EP correlation's predicate)."""
    body, lifter = _proven(fn, sides)
    return lifter.expr(body)


def lift_assignments(fn: Any, sides: tuple[str, ...]) -> dict[str, Expr]:
    """The dict display ``{"name": ..., ...}`` the lambda ``fn`` returns (a pattern's ``do``), each
    value a tree of :class:`Py` nodes, its parameters reading ``sides`` in order."""
    body, lifter = _proven(fn, sides)
    if not isinstance(body, ast.Dict):
        raise NotProvable("it returns no dict display ({...})")
    how, fields = lifter.dict(body)
    if how != "project":
        raise NotProvable("its dict display spreads a parameter")
    return fields


def _proven(fn: Any, sides: tuple[str, ...]) -> tuple[ast.AST, "_Lifter"]:
    node = proven(fn, len(sides), cells=True)
    calls = builtins_read(fn) - {"abs"}
    if calls:
        raise NotProvable(f"it calls {', '.join(sorted(calls))}, which has no expression")
    return node.body, _Lifter({a.arg: side for a, side in zip(node.args.args, sides)}, cell_constants(fn, node))


def why_not(kind: str, fn: Any) -> str | None:
    """Why ``fn`` stays a Python call (None when it is lifted)."""
    try:
        lift_steps(kind, fn)
    except NotProvable as exc:
        return str(exc)
    return None


class _Lifter:
    """Turns a lambda body's AST into a tree of :class:`Py` nodes; :class:`NotProvable` on the rest."""

    def __init__(self, sides: dict[str, str], constants: dict[str, Any]) -> None:
        self.sides = sides          # parameter name -> the side a field of it reads
        self.constants = constants  # a variable of an enclosing function -> its value, proven constant

    def dict(self, node: ast.Dict) -> tuple[str, dict[str, Expr]]:
        spread = [i for i, k in enumerate(node.keys) if k is None]
        if spread not in ([], [0]) or (spread and not self._is_param(node.values[0])):
            raise NotProvable("its dict display spreads something but its own parameter, first")
        keys = [k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None
                for k in node.keys[len(spread):]]
        if None in keys or len(set(keys)) != len(keys):
            raise NotProvable("its dict display has a key that is not a distinct string literal")
        fields = {k: self.expr(v) for k, v in zip(keys, node.values[len(spread):])}
        return ("assign" if spread else "project"), fields

    def _is_param(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in self.sides

    def expr(self, node: ast.AST) -> Expr:
        method = getattr(self, f"_{type(node).__name__.lower()}", None)
        if method is None:
            raise NotProvable(f"`{ast.unparse(node)}` has no expression form")
        return method(node)

    def _subscript(self, node: ast.Subscript) -> Expr:
        key = node.slice
        if not (self._is_param(node.value) and isinstance(key, ast.Constant) and isinstance(key.value, str)
                and key.value):
            raise NotProvable(f"`{ast.unparse(node)}` is not a field read e[\"name\"]")
        return Col(key.value, self.sides[node.value.id])

    def _name(self, node: ast.Name) -> Expr:
        """A variable of an enclosing function (``inline.cell_constants``): its value, a literal."""
        value = self.constants.get(node.id, self)
        if value is self or isinstance(value, tuple):
            raise NotProvable(f"`{node.id}` has no expression form" + (" but after `in`" if value is not self else ""))
        return self._constant(ast.Constant(value))

    def _constant(self, node: ast.Constant) -> Expr:
        value = node.value
        if not (value is None or isinstance(value, (bool, int, str))
                or (isinstance(value, float) and math.isfinite(value))):
            raise NotProvable(f"the literal {ast.unparse(node)} has no expression form")
        return Lit(value)

    def _binop(self, node: ast.BinOp) -> Expr:
        op = _ARITHMETIC.get(type(node.op))
        if op is None:
            raise NotProvable(f"`{ast.unparse(node)}`: only + - * / % have expressions")
        return Py(op, self.expr(node.left), self.expr(node.right))

    def _unaryop(self, node: ast.UnaryOp) -> Expr:
        op = {ast.USub: "neg", ast.Not: "not"}.get(type(node.op))
        if op is None:
            raise NotProvable(f"`{ast.unparse(node)}`: only - and not have expressions")
        return Py(op, self.expr(node.operand))

    def _boolop(self, node: ast.BoolOp) -> Expr:
        return Py("and" if isinstance(node.op, ast.And) else "or", *map(self.expr, node.values))

    def _call(self, node: ast.Call) -> Expr:
        if not (isinstance(node.func, ast.Name) and node.func.id == "abs" and len(node.args) == 1
                and not node.keywords and not isinstance(node.args[0], ast.Starred)):
            raise NotProvable(f"`{ast.unparse(node)}`: of calls only abs(x) has an expression")
        return Py("abs", self.expr(node.args[0]))

    def _compare(self, node: ast.Compare) -> Expr:
        """``a < b < c`` is ``a < b and b < c`` (``b`` read twice: a read has no side effect)."""
        operands = [node.left, *node.comparators]
        parts = [self._one(a, op, b) for a, op, b in zip(operands, node.ops, operands[1:])]
        return parts[0] if len(parts) == 1 else Py("and", *parts)

    def _one(self, a: ast.AST, op: ast.cmpop, b: ast.AST) -> Expr:
        if isinstance(op, (ast.Is, ast.IsNot)):
            if not (isinstance(b, ast.Constant) and b.value is None):
                raise NotProvable("`is` compares with None only")
            return Py("is_none" if isinstance(op, ast.Is) else "is_not_none", self.expr(a))
        name = _COMPARE[type(op)]
        if name in ("in", "not_in"):
            if isinstance(b, ast.Name) and isinstance(self.constants.get(b.id), tuple):
                b = ast.Tuple([ast.Constant(v) for v in self.constants[b.id]])
            if not isinstance(b, (ast.Tuple, ast.List)) or not all(map(_literal, b.elts)):
                raise NotProvable(f"`in {ast.unparse(b)}`: only a tuple or list of literals has an expression")
            return Py(name, self.expr(a), *map(self.expr, b.elts))
        return Py(name, self.expr(a), self.expr(b))


def _literal(node: ast.AST) -> bool:
    """A literal as written: a constant, or a negative number (``-2.0`` is ``-`` applied to ``2.0``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)
    return isinstance(node, ast.Constant)


def python_calls(app: Any) -> list[str]:
    """One note per map/filter of ``app`` whose function stays a Python call, naming it and why
    (the deployment puts them in its status events once, at deploy)."""
    notes = []
    for node in app.nodes.values():
        fn = node.params.get("fn")
        if node.name in ("map", "filter") and callable(fn) and not isinstance(fn, Expr):
            why = why_not(node.name, fn)
            if why is not None:
                notes.append(f"{node.op_id} calls its function per tuple (not lifted to an expression): {why}")
    return notes

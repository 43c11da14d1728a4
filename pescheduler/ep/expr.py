"""Predicates as small expression trees, so a database can run them as well as Python can.

A Python lambda is opaque: only Python can call it. A query that should run
inside a database (``EventProcessor(provider="sqlite")``, ...) writes its
predicates with this tree instead::

    from pescheduler import ep

    hot = (ep.col("a") - ep.col("b") == 1) & (ep.col("id") != "s0")
    assert hot({"id": "s1", "a": 3, "b": 2})                    # Python, on the native engine
    near = ep.left("a") - ep.right("b") == 2                    # a correlation: both sides
    assert near({"a": 5}, {"b": 3})
    rise = ep.col("a") - ep.measure("z") == 1                   # a pattern symbol: event and measures
    assert rise({"a": 4}, {"z": 3})

An expression is callable (``expr(event)``; ``expr(left, right)``;
``expr(event, measures)``), compiled once to Python source, so the native
engine runs it like a lambda; :func:`to_sql` compiles it to SQL text with
every literal as a bound parameter. ``&``, ``|`` and ``~`` are *and*, *or*
and *not* (Python's ``and``/``or``/``not`` cannot be overloaded, so using
them on an expression raises). ``/`` is true division and ``%`` the
floor modulo of Python on every backend.

This tree is deliberately small and backend-neutral; the seam with the
project-wide ``pescheduler.col`` expression module is :func:`lift` (turning
a value into a node) and :func:`to_sql`.
"""

from __future__ import annotations

import re
from typing import Any, Callable

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# Python operator -> (Python source, SQL source); the SQL forms that differ by
# database (division, modulo) come from the dialect.
_BINARY = {"+": "+", "-": "-", "*": "*", "/": "/", "%": "%", "==": "==", "!=": "!=", "<": "<",
           "<=": "<=", ">": ">", ">=": ">=", "&": "and", "|": "or"}
_SQL = {"==": "=", "!=": "<>", "&": "AND", "|": "OR"}
SIDES = ("event", "left", "right", "measure")


class Expr:
    """A node; operators build bigger nodes, calling it evaluates it in Python."""

    __slots__ = ("_fn",)

    def _node(self, op: str, other: Any, swap: bool = False) -> "BinOp":
        other = lift(other)
        return BinOp(op, other, self) if swap else BinOp(op, self, other)

    def __add__(self, o): return self._node("+", o)
    def __radd__(self, o): return self._node("+", o, True)
    def __sub__(self, o): return self._node("-", o)
    def __rsub__(self, o): return self._node("-", o, True)
    def __mul__(self, o): return self._node("*", o)
    def __rmul__(self, o): return self._node("*", o, True)
    def __truediv__(self, o): return self._node("/", o)
    def __rtruediv__(self, o): return self._node("/", o, True)
    def __mod__(self, o): return self._node("%", o)
    def __rmod__(self, o): return self._node("%", o, True)
    def __eq__(self, o): return self._node("==", o)         # type: ignore[override]
    def __ne__(self, o): return self._node("!=", o)         # type: ignore[override]
    def __lt__(self, o): return self._node("<", o)
    def __le__(self, o): return self._node("<=", o)
    def __gt__(self, o): return self._node(">", o)
    def __ge__(self, o): return self._node(">=", o)
    def __and__(self, o): return self._node("&", o)
    def __rand__(self, o): return self._node("&", o, True)
    def __or__(self, o): return self._node("|", o)
    def __ror__(self, o): return self._node("|", o, True)
    def __invert__(self): return Not(self)
    def __neg__(self): return BinOp("-", Lit(0), self)
    def __abs__(self): return Abs(self)
    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise TypeError(f"{self!r} is an expression, not a truth value: combine conditions with "
                        f"& | ~ (not and/or/not), each in parentheses")

    def __call__(self, first: Any, second: Any = None) -> Any:
        return self.function()(first, second)

    def function(self) -> Callable[..., Any]:
        """The expression compiled to a Python function ``fn(first, second=None)`` (once)."""
        try:
            return self._fn
        except AttributeError:
            self._fn = _python(self)
            return self._fn

    def refs(self) -> set[tuple[str, str]]:
        """Every ``(side, field)`` the expression reads."""
        out: set = set()
        self._refs(out)
        return out

    def _refs(self, out: set) -> None:
        pass


class Field(Expr):
    __slots__ = ("side", "name")

    def __init__(self, side: str, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a field name is a non-empty string, got {name!r}")
        self.side, self.name = side, name

    def _refs(self, out: set) -> None:
        out.add((self.side, self.name))

    def __repr__(self) -> str:
        return f"{'col' if self.side == 'event' else self.side}({self.name!r})"


class Lit(Expr):
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        if not isinstance(value, (int, float, str, bool)):
            raise TypeError(f"an expression literal is an int, float, str or bool, got {value!r}")
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


class BinOp(Expr):
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr) -> None:
        self.op, self.a, self.b = op, a, b

    def _refs(self, out: set) -> None:
        self.a._refs(out)
        self.b._refs(out)

    def __repr__(self) -> str:
        return f"({self.a!r} {self.op} {self.b!r})"


class Not(Expr):
    __slots__ = ("a",)

    def __init__(self, a: Expr) -> None:
        self.a = a

    def _refs(self, out: set) -> None:
        self.a._refs(out)

    def __repr__(self) -> str:
        return f"~{self.a!r}"


class Abs(Not):
    def __repr__(self) -> str:
        return f"abs({self.a!r})"


def col(name: str) -> Field:
    """The field ``name`` of the event (the first argument)."""
    return Field("event", name)


def left(name: str) -> Field:
    """In a correlation predicate: the field ``name`` of the left event."""
    return Field("left", name)


def right(name: str) -> Field:
    """In a correlation predicate: the field ``name`` of the right event."""
    return Field("right", name)


def measure(name: str) -> Field:
    """In a pattern: the measure ``name`` of the run (set by ``do``)."""
    return Field("measure", name)


def lit(value: Any) -> Lit:
    """A constant (e.g. ``ep.lit(True)``: a pattern symbol every event matches)."""
    return Lit(value)


def lift(value: Any) -> Expr:
    """``value`` as a node: an expression as it is, a constant as a literal."""
    return value if isinstance(value, Expr) else Lit(value)


def conjuncts(expr: Expr) -> list[Expr]:
    """``a & b & c`` as ``[a, b, c]`` (the parts a database and Python may share out)."""
    if isinstance(expr, BinOp) and expr.op == "&":
        return conjuncts(expr.a) + conjuncts(expr.b)
    return [expr]


# -- Python ------------------------------------------------------------------------------------
def _python(expr: Expr) -> Callable[[Any, Any], Any]:
    consts: list = []

    def src(e: Expr) -> str:
        if isinstance(e, Field):
            arg = "a1" if e.side in ("right", "measure") else "a0"
            return f"{arg}[{e.name!r}]"
        if isinstance(e, Lit):
            consts.append(e.value)
            return f"c[{len(consts) - 1}]"
        if isinstance(e, Abs):
            return f"abs({src(e.a)})"
        if isinstance(e, Not):
            return f"(not {src(e.a)})"
        return f"({src(e.a)} {_BINARY[e.op]} {src(e.b)})"

    code = f"lambda a0, a1=None: {src(expr)}"
    return eval(code, {"c": consts, "__builtins__": {"abs": abs}})   # noqa: S307 (our own source)


# -- SQL ---------------------------------------------------------------------------------------
def to_sql(expr: Expr, column: Callable[[Field], str], dialect: Any, params: list) -> str:
    """SQL text for ``expr``; literals are appended to ``params`` and written as placeholders.

    ``column(field)`` names the column a field reference reads (raising for one
    the database cannot see, e.g. a pattern measure); ``dialect`` gives the
    placeholder and the division and modulo that match Python's.
    """
    def sql(e: Expr) -> str:
        if isinstance(e, Field):
            return column(e)
        if isinstance(e, Lit):
            params.append(e.value)
            return dialect.param(e.value)
        if isinstance(e, Abs):
            return f"ABS({sql(e.a)})"
        if isinstance(e, Not):
            return f"(NOT {sql(e.a)})"
        if e.op == "%":                  # floor_mod writes a once, then b three times
            a = sql(e.a)
            mark = len(params)
            b = sql(e.b)
            params.extend(params[mark:] * 2)
            return dialect.floor_mod(a, b)
        a, b = sql(e.a), sql(e.b)
        if e.op == "/":
            return f"({dialect.real(a)} / {b})"
        return f"({a} {_SQL.get(e.op, e.op)} {b})"

    return sql(expr)

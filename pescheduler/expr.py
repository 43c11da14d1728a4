"""Expressions over named fields: one small tree, compiled per backend.

``col("speed") / 3.6`` builds a tree; nothing is evaluated until a backend
compiles it. The same tree runs three ways:

* **rows** (lists of dicts): :func:`compile_rows` generates one Python loop for a
  whole fused run of map/filter steps (no call per tuple per operator);
* **Arrow** (``pyarrow.RecordBatch``): :func:`evaluate_arrow` maps each node to a
  ``pyarrow.compute`` kernel, so a batch is never split into rows;
* **Python callable** (the native ``ep`` engine): ``expr(event)``,
  ``expr(left, right)`` or ``expr(event, measures)`` runs the same generated
  code as the rows backend, compiled once per node (:meth:`Expr.function`);
* **SQL** (the ``ep`` database providers, :mod:`pescheduler.ep.predicates`) walks the
  tree with a :class:`Visitor`, every literal a bound parameter.

A column belongs to a *side*: ``col`` reads the event (the only side a stream
map/filter has); ``pescheduler.ep`` adds ``left``/``right`` (the two events of a
correlation) and ``measure`` (a pattern run's measures), which read the second
argument of the callable. ``ep.col`` *is* this ``col``.

Example::

    from pescheduler import Application, col

    app = Application("cars")
    (app.source("generator", events=1000, seed=1)
        .map(speed=col("speed") / 3.6)
        .filter((col("speed") > 5) & col("car").is_not_null())
        .sink("print"))

Semantics, identical on every backend (the tests check both):

* null is ``None`` in a dict and null in Arrow. Arithmetic and comparison with
  a null give null; ``&``, ``|`` and ``~`` follow SQL's three-valued logic
  (``False & null`` is False, ``True | null`` is True); a filter keeps only rows
  whose predicate is true (null drops the row), as SQL's WHERE does.
* ``+ - *`` keep integers integral (int with float gives float); ``/`` is true
  division and always gives a float; ``%`` is Python's floor modulo (the sign
  of the divisor) on every backend. Division or modulo by zero gives null
  (SQL's ``a / NULLIF(b, 0)``), not an error -- on the native EP engine too,
  so a query gives the same rows there as on a database (a decision: the EP
  engine used to dead-letter the event instead; a null is what every SQL
  provider gives, and a filter drops it).
* comparing values of different kinds (a string with a number) is an error:
  on rows the tuple is dead-lettered, on Arrow the batch fails.
* a missing field is an error (KeyError on rows, on Arrow a missing column).

* string functions (:func:`upper`, :func:`lower`, :func:`length`, :func:`substring`,
  :func:`trim`/:func:`ltrim`/:func:`rtrim`, :func:`concat`, :func:`replace`,
  :func:`position`, ``e.like(pattern)``) have SQL's meaning, written once in
  :mod:`pescheduler.strings` (null in, null out; lengths in characters; SQL's
  1-based SUBSTRING); :func:`nullif` is SQL's ``NULLIF`` (a ``when``).

The tree is plain data: :class:`Col`, :class:`Lit`, :class:`Binary` (``op`` in
:data:`BINARY`), :class:`Unary` (``op`` in :data:`UNARY`), :class:`Func` (a string
function of :data:`pescheduler.strings.FUNCTIONS`). A backend subclasses
:class:`Visitor` and implements one method per node class.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .inline import inline

ARITHMETIC = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%"}
COMPARISON = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
BOOLEAN = {"and": "&", "or": "|"}
BINARY = {**ARITHMETIC, **COMPARISON, **BOOLEAN}
"""Binary operators: name -> the Python operator that builds it."""
UNARY = ("neg", "not", "is_null", "is_not_null", "abs")
"""Unary operators and functions."""
SIDES = ("event", "left", "right", "measure")
"""What a column reads: the event (first argument), or in EP predicates the left/right event of a
correlation or a pattern run's measures (``left`` reads the first argument, the others the second)."""


class Expr:
    """A node of the tree; operators on it build bigger trees (it is immutable)."""

    __slots__ = ("_fn",)      # the compiled Python function, set once by function()

    def _bin(self, op: str, other: Any, swap: bool = False) -> "Binary":
        other = other if isinstance(other, Expr) else Lit(other)
        return Binary(op, other, self) if swap else Binary(op, self, other)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __mod__(self, o): return self._bin("mod", o)
    def __rmod__(self, o): return self._bin("mod", o, True)
    def __eq__(self, o): return self._bin("eq", o)        # type: ignore[override]
    def __ne__(self, o): return self._bin("ne", o)        # type: ignore[override]
    def __lt__(self, o): return self._bin("lt", o)
    def __le__(self, o): return self._bin("le", o)
    def __gt__(self, o): return self._bin("gt", o)
    def __ge__(self, o): return self._bin("ge", o)
    def __and__(self, o): return self._bin("and", o)
    def __rand__(self, o): return self._bin("and", o, True)
    def __or__(self, o): return self._bin("or", o)
    def __ror__(self, o): return self._bin("or", o, True)
    def __neg__(self): return Unary("neg", self)
    def __invert__(self): return Unary("not", self)
    def __abs__(self): return Unary("abs", self)

    def is_null(self) -> "Unary":
        return Unary("is_null", self)

    def is_not_null(self) -> "Unary":
        return Unary("is_not_null", self)

    def like(self, pattern: Any) -> "Func":
        """SQL's ``LIKE``: ``%`` any run of characters, ``_`` one (no escape character)."""
        return Func("like", self, pattern)

    __hash__ = object.__hash__

    def __setattr__(self, *_):
        raise AttributeError("expressions are immutable")

    def __reduce__(self):
        return (type(self), tuple(getattr(self, name) for name in self.__slots__))

    def __bool__(self):
        raise TypeError("an expression has no truth value: combine conditions with & | ~, "
                        "not and/or/not (and parenthesise comparisons)")

    def __call__(self, first: Any, second: Any = None) -> Any:
        """Evaluate on ``event``, ``(left, right)`` or ``(event, measures)``: null is None."""
        return self.function()(first, second)

    def function(self) -> Callable[[Any, Any], Any]:
        """The expression compiled to ``fn(first, second=None)`` (generated once, then cached)."""
        try:
            return self._fn
        except AttributeError:
            object.__setattr__(self, "_fn", compile_function(self))
            return self._fn

    def children(self) -> tuple["Expr", ...]:
        return ()

    def refs(self) -> set[tuple[str, str]]:
        """Every ``(side, field)`` the expression reads."""
        found: set[tuple[str, str]] = set()
        stack: list[Expr] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, Col):
                found.add((node.side, node.name))
            stack.extend(node.children())
        return found

    def columns(self) -> set[str]:
        """Every field the expression reads."""
        return {name for _, name in self.refs()}

    def same(self, other: "Expr") -> bool:
        """Structural equality (``==`` builds a comparison instead)."""
        return repr(self) == repr(other)


class Col(Expr):
    """The value of field ``name`` of ``side`` (one of :data:`SIDES`)."""

    __slots__ = ("name", "side")

    def __init__(self, name: str, side: str = "event") -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"col() takes a field name (a non-empty string), got {name!r}")
        if side not in SIDES:
            raise ValueError(f"unknown side {side!r}; known: {SIDES}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "side", side)

    def __repr__(self) -> str:
        return f"{'col' if self.side == 'event' else self.side}({self.name!r})"


class Lit(Expr):
    """A constant: int, float, str, bool or None (null)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise TypeError(f"a literal must be None, bool, int, float or str, got {value!r}")
        object.__setattr__(self, "value", value)

    def __repr__(self) -> str:
        return f"lit({self.value!r})"


class Binary(Expr):
    """``left op right``, ``op`` one of :data:`BINARY`."""

    __slots__ = ("op", "left", "right")

    def __init__(self, op: str, left: Expr, right: Expr) -> None:
        if op not in BINARY:
            raise ValueError(f"unknown binary operator {op!r}; known: {sorted(BINARY)}")
        for name, value in (("op", op), ("left", left), ("right", right)):
            object.__setattr__(self, name, value)

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def __repr__(self) -> str:
        return f"({self.left!r} {BINARY[self.op]} {self.right!r})"


class Unary(Expr):
    """``op(operand)``, ``op`` one of :data:`UNARY`."""

    __slots__ = ("op", "operand")

    def __init__(self, op: str, operand: Expr) -> None:
        if op not in UNARY:
            raise ValueError(f"unknown unary operator {op!r}; known: {UNARY}")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "operand", operand)

    def children(self) -> tuple[Expr, ...]:
        return (self.operand,)

    def __repr__(self) -> str:
        return f"{self.op}({self.operand!r})"


class When(Expr):
    """``when(cond, value).when(...).otherwise(default)``: the value of the first case whose
    condition is true, else ``default`` (null without ``otherwise``), as SQL's ``CASE WHEN``.

    A null condition is not true (SQL's rule, and a filter's). Only what is needed is
    evaluated: a later condition only when the earlier ones were not true, one value only;
    so a branch not taken cannot fail a row (rows and the Python callable; Arrow computes
    every branch over the batch, as its kernels do)."""

    __slots__ = ("cases", "default")

    def __init__(self, cases: tuple, default: Any = None) -> None:
        cases = tuple((lift(c), lift(v)) for c, v in cases)
        if not cases:
            raise ValueError("when(...) needs at least one (condition, value) case")
        object.__setattr__(self, "cases", cases)
        object.__setattr__(self, "default", lift(default))

    def when(self, condition: Any, value: Any) -> "When":
        """One more case, tried when the ones before were not true."""
        if self.default.__class__ is not Lit or self.default.value is not None:
            raise ValueError("when(...) after otherwise(...): the default comes last")
        return When(self.cases + ((condition, value),))

    def otherwise(self, default: Any) -> "When":
        """The value where no case is true (null if never given)."""
        return When(self.cases, default)

    def children(self) -> tuple[Expr, ...]:
        return tuple(x for case in self.cases for x in case) + (self.default,)

    def __repr__(self) -> str:
        cases = "".join(f".when({c!r}, {v!r})" for c, v in self.cases)[1:]
        return f"{cases}.otherwise({self.default!r})"


class Coalesce(Expr):
    """``coalesce(a, b, ...)``: the first of its arguments that is not null (null if all are),
    as SQL's ``COALESCE``; an argument is evaluated only when those before it were null."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        if not args:
            raise ValueError("coalesce(...) needs at least one argument")
        object.__setattr__(self, "args", tuple(lift(a) for a in args))

    def __reduce__(self):
        return (type(self), self.args)

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def __repr__(self) -> str:
        return f"coalesce({', '.join(map(repr, self.args))})"


class Func(Expr):
    """String function ``name`` (:data:`pescheduler.strings.FUNCTIONS`) of ``args``: null if an
    argument is null, SQL's meaning on every backend (:mod:`pescheduler.strings`)."""

    __slots__ = ("name", "args")

    def __init__(self, name: str, *args: Any) -> None:
        from .strings import FUNCTIONS

        if name not in FUNCTIONS:
            raise ValueError(f"unknown function {name!r}; known: {sorted(FUNCTIONS)}")
        _fn, least, most = FUNCTIONS[name]
        if not least <= len(args) <= most:
            raise TypeError(f"{name}() takes {least}{'' if least == most else f' to {most}'} arguments, "
                            f"got {len(args)}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "args", tuple(lift(a) for a in args))

    def __reduce__(self):
        return (type(self), (self.name, *self.args))

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(map(repr, self.args))})"


PYTHON = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "eq": "==", "ne": "!=", "lt": "<",
          "le": "<=", "gt": ">", "ge": ">=", "and": "and", "or": "or", "in": "in", "not_in": "not in",
          "not": "not", "truth": "not not", "neg": "-", "abs": "abs", "is_none": "is None",
          "is_not_none": "is not None"}
"""Operators of :class:`Py` nodes (a lifted lambda's), by the Python they stand for."""


class Py(Expr):
    """Python's own ``op`` (:data:`PYTHON`) on ``args``: what :mod:`pescheduler.lift` makes of a lambda.

    Unlike :class:`Binary`/:class:`Unary`, exactly Python's semantics: arithmetic
    with None raises, division by zero raises, ``and``/``or`` short-circuit and
    give an operand, a filter keeps what is truthy. ``in``/``not_in``: ``args``
    are the value then the literals of a tuple. Rows run it as the same nested
    Python expression; Arrow runs kernels where they are provably the same and
    raises :class:`~pescheduler.errors.PythonOnly` otherwise (``pescheduler.exact_arrow``)."""

    __slots__ = ("op", "args")

    def __init__(self, op: str, *args: Expr) -> None:
        if op not in PYTHON:
            raise ValueError(f"unknown Python operator {op!r}; known: {sorted(PYTHON)}")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "args", tuple(args))

    def __reduce__(self):
        return (type(self), (self.op, *self.args))

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def __repr__(self) -> str:
        return f"py({python_source(self, repr)})"


def python_source(e: Expr, read: Callable[[Col], str]) -> str:
    """``e`` as one nested Python expression, evaluated exactly as the lambda it came from
    (same order, same short-circuits); ``read(col)`` gives the source reading a field."""
    if isinstance(e, Col):
        return read(e)
    if isinstance(e, Lit):
        return repr(e.value)
    if not isinstance(e, Py):
        raise TypeError(f"{e!r} is not Python code (col expressions have null semantics)")
    args = [python_source(a, read) for a in e.args]
    op, sym = e.op, PYTHON[e.op]
    if op in ("and", "or"):
        return "(" + f" {sym} ".join(args) + ")"
    if op in ("in", "not_in"):
        return f"({args[0]} {sym} ({''.join(a + ', ' for a in args[1:])}))"
    if op in ("is_none", "is_not_none"):
        return f"({args[0]} {sym})"
    if op == "abs":
        return f"abs({args[0]})"
    if op in ("not", "truth", "neg"):
        return f"({sym} {args[0]})"
    return f"({args[0]} {sym} {args[1]})"


def col(name: str) -> Col:
    """A field of the tuple: ``col("speed") / 3.6``."""
    return Col(name)


def lit(value: Any) -> Lit:
    """A constant, for when neither side of an operator is an expression yet."""
    return Lit(value)


def when(condition: Any, value: Any) -> When:
    """A conditional: ``when(col("speed") > 120, "fast").when(col("speed") > 50, "ok").otherwise("slow")``."""
    return When(((condition, value),))


def coalesce(*args: Any) -> Coalesce:
    """The first argument that is not null: ``coalesce(col("nickname"), col("name"), "?")``."""
    return Coalesce(*args)


def upper(x: Any) -> Func:
    """Upper case by Unicode's full mapping, as Python's ``str.upper`` (``"ß"`` -> ``"SS"``)."""
    return Func("upper", x)


def lower(x: Any) -> Func:
    return Func("lower", x)


def length(x: Any) -> Func:
    """The number of characters (code points, not bytes): SQL's ``CHAR_LENGTH``."""
    return Func("length", x)


def substring(x: Any, start: Any, count: Any = None) -> Func:
    """SQL's ``SUBSTRING(x FROM start FOR count)``, 1-based: ``substring(col("vin"), 1, 3)``."""
    return Func("substring", x, start) if count is None else Func("substring", x, start, count)


def trim(x: Any) -> Func:
    """Spaces off both ends (SQL's ``TRIM``: only ``' '``, not tabs or newlines)."""
    return Func("trim", x)


def ltrim(x: Any) -> Func:
    return Func("ltrim", x)


def rtrim(x: Any) -> Func:
    return Func("rtrim", x)


def concat(*parts: Any) -> Func:
    """SQL's ``a || b || ...``: null if any part is null; every part text."""
    return Func("concat", *parts)


def replace(x: Any, old: Any, new: Any) -> Func:
    """Every ``old`` in ``x`` by ``new`` (an empty ``old`` changes nothing, as in SQL)."""
    return Func("replace", x, old, new)


def position(sub: Any, x: Any) -> Func:
    """SQL's ``POSITION(sub IN x)``: where ``sub`` first starts (1-based), 0 if nowhere."""
    return Func("position", sub, x)


def nullif(a: Any, b: Any) -> When:
    """SQL's ``NULLIF(a, b)``: null where ``a = b`` is true, else ``a``."""
    return When(((lift(a) == lift(b), None),), a)


def lift(value: Any) -> Expr:
    """``value`` as a node: an expression as it is, a constant as a literal."""
    return value if isinstance(value, Expr) else Lit(value)


def conjuncts(e: Expr) -> list[Expr]:
    """``a & b & c`` as ``[a, b, c]`` (the parts two backends may share out)."""
    if isinstance(e, Binary) and e.op == "and":
        return conjuncts(e.left) + conjuncts(e.right)
    return [e]


class Visitor:
    """Walks a tree bottom-up: ``visit(e)`` calls ``col``/``lit``/``binary``/``unary``.

    ``binary`` and ``unary`` receive the node and their operands already visited.
    """

    def visit(self, e: Expr) -> Any:
        if isinstance(e, Col):
            return self.col(e)
        if isinstance(e, Lit):
            return self.lit(e)
        if isinstance(e, Binary):
            return self.binary(e, self.visit(e.left), self.visit(e.right))
        if isinstance(e, Unary):
            return self.unary(e, self.visit(e.operand))
        if isinstance(e, Py):
            return self.py(e)
        if isinstance(e, When):
            return self.when(e)
        if isinstance(e, Coalesce):
            return self.coalesce(e)
        if isinstance(e, Func):
            return self.func(e, [self.visit(a) for a in e.args])
        raise TypeError(f"not an expression: {e!r}")

    def col(self, e: Col) -> Any: raise NotImplementedError
    def lit(self, e: Lit) -> Any: raise NotImplementedError
    def binary(self, e: Binary, left: Any, right: Any) -> Any: raise NotImplementedError
    def unary(self, e: Unary, operand: Any) -> Any: raise NotImplementedError

    def py(self, e: "Py") -> Any:
        """A lifted lambda's node (its children unvisited: Python's order is the backend's to keep)."""
        raise TypeError(f"{e!r} has Python's semantics, which this backend does not give")

    def when(self, e: When) -> Any:
        """A conditional (its children unvisited: what is evaluated, when, is the backend's to keep)."""
        raise TypeError(f"this backend has no conditional: {e!r}")

    def coalesce(self, e: Coalesce) -> Any:
        """``coalesce`` (its arguments unvisited, as for :meth:`when`)."""
        raise TypeError(f"this backend has no coalesce: {e!r}")

    def func(self, e: Func, args: list) -> Any:
        """A string function, its arguments visited."""
        raise TypeError(f"this backend has no string functions: {e!r}")


# -- rows: generated Python ---------------------------------------------------------------------

class _PyCode(Visitor):
    """Emits statements computing an expression into local variables.

    Returns ``(code, nullable)``: ``code`` is a local name or a literal; null
    checks are written only where a value can be None.
    """

    def __init__(self, lines: list[str], env: dict[str, str], reads: dict, indent: str,
                 counter: list[int], args: dict[str, str] | None = None) -> None:
        self.lines, self.env, self.reads, self.indent, self.counter = lines, env, reads, indent, counter
        self.args = args or {"event": "t"}        # side -> the variable holding its mapping

    def _var(self, value: str) -> str:
        name = f"v{self.counter[0]}"
        self.counter[0] += 1
        self.lines.append(f"{self.indent}{name} = {value}")
        return name

    def col(self, e: Col) -> tuple[str, bool]:
        if e.side == "event" and e.name in self.env:          # assigned earlier in this run
            return self.env[e.name], True
        if e.side not in self.args:
            raise ValueError(f"{e!r} has no meaning here (this expression may read "
                             f"{', '.join(self.args)} fields)")
        key = (e.side, e.name)
        if key not in self.reads:
            self.reads[key] = self._var(f"{self.args[e.side]}[{e.name!r}]")
        return self.reads[key], True

    def lit(self, e: Lit) -> tuple[str, bool]:
        return repr(e.value), e.value is None

    def binary(self, e: Binary, left: tuple, right: tuple) -> tuple[str, bool]:
        (a, an), (b, bn) = left, right
        if e.op in BOOLEAN:
            return self._boolean(e.op, a, an, b, bn)
        nulls = [x for x, n in ((a, an), (b, bn)) if n]
        checks = [f"{x} is None" for x in nulls]
        if e.op in ("div", "mod") and not (isinstance(e.right, Lit) and e.right.value not in (0, None)):
            checks.append(f"{b} == 0")
        value = f"{a} {BINARY[e.op]} {b}" if e.op not in COMPARISON else f"{a} {COMPARISON[e.op]} {b}"
        if not checks:
            return self._var(value), False
        return self._var(f"None if {' or '.join(checks)} else {value}"), True

    def _boolean(self, op: str, a: str, an: bool, b: str, bn: bool) -> tuple[str, bool]:
        if not (an or bn):
            return self._var(f"{a} {op} {b}"), False
        short, other = ("False", "True") if op == "and" else ("True", "False")
        return self._var(f"{short} if ({a} is {short} or {b} is {short}) else "
                         f"(None if ({a} is None or {b} is None) else {other})"), True

    def py(self, e: Py) -> tuple[str, bool]:
        """The lambda's own expression, nested as written: no read hoisted out of a short-circuit."""
        def read(c: Col) -> str:
            if c.side == "event" and c.name in self.env:
                return self.env[c.name]
            if c.side not in self.args:
                raise ValueError(f"{c!r} has no meaning here")
            return f"{self.args[c.side]}[{c.name!r}]"
        return self._var(python_source(e, read)), False

    def _branch(self, e: Expr, out: str, depth: int) -> bool:
        """Lines, one level deeper, computing ``e`` into ``out``: its reads stay in the branch."""
        inner = _PyCode(self.lines, self.env, dict(self.reads), self.indent + "    " * depth,
                        self.counter, self.args)
        code, nullable = inner.visit(e)
        self.lines.append(f"{inner.indent}{out} = {code}")
        return nullable

    def when(self, e: When) -> tuple[str, bool]:
        """Nested ``if``/``else``: a condition runs only when the ones before were not true."""
        out = f"v{self.counter[0]}"
        self.counter[0] += 1
        nullable, depth = False, 0
        for condition, value in e.cases:
            test = _PyCode(self.lines, self.env, dict(self.reads), self.indent + "    " * depth,
                           self.counter, self.args)
            code, _ = test.visit(condition)
            self.lines.append(f"{test.indent}if {code} is True:")
            nullable |= self._branch(value, out, depth + 1)
            self.lines.append(f"{test.indent}else:")
            depth += 1
        nullable |= self._branch(e.default, out, depth)
        return out, nullable

    def coalesce(self, e: Coalesce) -> tuple[str, bool]:
        """The first argument not None; the next is computed only when it is needed."""
        out = f"v{self.counter[0]}"
        self.counter[0] += 1
        nullable = self._branch(e.args[0], out, 0)
        for depth, arg in enumerate(e.args[1:]):
            if not nullable:
                break
            self.lines.append(f"{self.indent}{'    ' * depth}if {out} is None:")
            nullable = self._branch(arg, out, depth + 1)
        return out, nullable

    def func(self, e: Func, args: list) -> tuple[str, bool]:
        """``_s_<name>(...)`` (:data:`STRING_HELPERS`), None where an argument is."""
        call = f"_s_{e.name}({', '.join(a for a, _n in args)})"
        checks = [f"{a} is None" for a, n in args if n]
        return self._var(f"None if {' or '.join(checks)} else {call}" if checks else call), True

    def unary(self, e: Unary, operand: tuple) -> tuple[str, bool]:
        x, n = operand
        if e.op in ("is_null", "is_not_null") and isinstance(e.operand, Lit):     # no `1 is None`
            return repr((e.operand.value is None) is (e.op == "is_null")), False
        if e.op == "is_null":
            return self._var(f"{x} is None"), False
        if e.op == "is_not_null":
            return self._var(f"{x} is not None"), False
        value = {"neg": f"-{x}", "not": f"not {x}", "abs": f"abs({x})"}[e.op]
        return (self._var(f"None if {x} is None else {value}"), True) if n else (self._var(value), False)


def compile_rows(steps: Iterable[tuple[str, Any]], title: str = "run", inline_lambdas: bool = True) -> Callable:
    """Generate ``run(batch) -> (out, drops)``: one loop over a list of tuples for every step.

    ``steps`` are ``("assign", {field: Expr})`` (a map with expressions: a new
    dict with those fields), ``("project", {field: Expr})`` (a dict of only
    those fields), ``("where", Expr)`` (a filter), ``("map", fn)`` and
    ``("filter", fn)`` (lambdas, called per tuple). ``drops[i]`` counts the
    tuples step ``i`` removed, so each fused operator's counts stay exact.
    ``inline_lambdas``: a one-expression lambda runs in the loop itself, not
    called (``pescheduler.inline``; off where a failing tuple's traceback
    should show the user's own line: an operator run alone, the replay of a
    fused run that raised).
    Assignments are kept in locals and the dict is built once, after the last
    filter that could drop the tuple (or before a lambda that needs it).
    """
    steps = list(steps)
    lines = ["def run(batch):", "    out = []", "    append = out.append"]
    lines += [f"    d{i} = 0" for i in range(len(steps))]
    lines += ["    for t in batch:"]
    ns: dict[str, Any] = dict(_string_helpers())
    env: dict[str, str] = {}           # field -> local holding its new value
    reads: dict[str, str] = {}         # field -> local holding t[field]
    counter = [0]
    ind = " " * 8

    def materialise() -> None:
        if env:
            fields = ", ".join(f"{k!r}: {v}" for k, v in env.items())
            lines.append(f"{ind}t = {{**t, {fields}}}")
            env.clear()
        reads.clear()

    for i, (kind, arg) in enumerate(steps):
        if kind == "assign":
            new = {}
            for name, e in arg.items():
                e = e if isinstance(e, Expr) else Lit(e)
                new[name] = _PyCode(lines, env, reads, ind, counter).visit(e)[0]
            env.update(new)
        elif kind == "project":                # a new dict of just these fields (a lifted lambda's)
            new = {name: _PyCode(lines, env, reads, ind, counter).visit(e)[0] for name, e in arg.items()}
            env.clear()
            reads.clear()
            lines.append(f"{ind}t = {{{', '.join(f'{k!r}: {v}' for k, v in new.items())}}}")
        elif kind == "where":
            code, nullable = _PyCode(lines, env, reads, ind, counter).visit(arg)
            test = f"{code} is not True" if nullable else f"not {code}"
            lines += [f"{ind}if {test}:", f"{ind}    d{i} += 1", f"{ind}    continue"]
        elif kind in ("map", "filter"):
            materialise()
            inlined = inline(arg, _generated) if inline_lambdas else None
            if inlined is None:
                ns[f"f{i}"] = arg
                code = f"f{i}(t)"
            else:                               # the lambda's own expression, in place (inline.py)
                param, code = inlined
                if param != "t":
                    lines.append(f"{ind}{param} = t")
                code = f"({code})"
            if kind == "map":
                lines.append(f"{ind}t = {code}")
            else:
                lines += [f"{ind}if not {code}:", f"{ind}    d{i} += 1", f"{ind}    continue"]
        else:
            raise ValueError(f"unknown step {kind!r}")
    materialise()
    lines += [f"{ind}append(t)", f"    return out, ({', '.join(f'd{i}' for i in range(len(steps)))},)"]
    from .aggregates import _generate     # the project's one code generator (linecache-visible)

    return _generate(lines, "run", ns, f"expr {title}")


def _generated(name: str) -> bool:
    """A name :func:`compile_rows`'s loop uses itself (an inlined lambda must not use it)."""
    return name in ("run", "batch", "out", "append", "t") or name.startswith("_s_") or (
        name[:1] in ("d", "f", "v") and name[1:].isdigit())


def compile_function(e: Expr) -> Callable[[Any, Any], Any]:
    """``fn(first, second=None)``: ``e`` on one event (``col``/``left`` read ``first``,
    ``right``/``measure`` read ``second``), with the null rules of :func:`compile_rows`."""
    lines = ["def fn(a0, a1=None):"]
    args = {"event": "a0", "left": "a0", "right": "a1", "measure": "a1"}
    code, _ = _PyCode(lines, {}, {}, "    ", [0], args).visit(e)
    lines.append(f"    return {code}")
    from .aggregates import _generate

    return _generate(lines, "fn", dict(_string_helpers()), f"expr {e!r}"[:80])


def _string_helpers() -> dict[str, Callable]:
    """The generated code's names of the string functions (``_s_upper``, ...)."""
    from .strings import FUNCTIONS

    return {f"_s_{name}": fn for name, (fn, _least, _most) in FUNCTIONS.items()}


# -- Arrow: pyarrow.compute kernels --------------------------------------------------------------

class _ArrowEval(Visitor):
    """Evaluates a tree on one ``pyarrow.RecordBatch``: arrays (or scalars for constants)."""

    def __init__(self, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        self.pa, self.pc, self.batch = pa, pc, batch

    def col(self, e: Col) -> Any:
        i = self.batch.schema.get_field_index(e.name)
        if i < 0:
            raise KeyError(e.name)
        return self.batch.column(i)

    def lit(self, e: Lit) -> Any:
        return self.pa.scalar(e.value)

    def binary(self, e: Binary, a: Any, b: Any) -> Any:
        pc, pa = self.pc, self.pa
        if pa.null() in (a.type, b.type):       # a null literal: Arrow has no kernel for its type
            if a.type == b.type:
                return pa.scalar(None, pa.bool_() if e.op in COMPARISON or e.op in BOOLEAN else pa.null())
            a, b = (a.cast(b.type), b) if a.type == pa.null() else (a, b.cast(a.type))
        if e.op == "div":
            f64 = pa.float64()
            q = pc.divide(pc.cast(a, f64), pc.cast(b, f64))
            if isinstance(e.right, Lit) and e.right.value not in (0, None):
                return q
            return pc.if_else(pc.equal(b, 0), pa.scalar(None, f64), q)
        if e.op == "mod":
            return self._floor_mod(a, b)
        fn = {"add": pc.add, "sub": pc.subtract, "mul": pc.multiply, "eq": pc.equal,
              "ne": pc.not_equal, "lt": pc.less, "le": pc.less_equal, "gt": pc.greater,
              "ge": pc.greater_equal, "and": pc.and_kleene, "or": pc.or_kleene}[e.op]
        return fn(a, b)

    def _floor_mod(self, a: Any, b: Any) -> Any:
        """Python's ``a % b`` (the sign of ``b``); null where ``b`` is 0, as ``/``."""
        pc, pa = self.pc, self.pa
        b = pc.if_else(pc.equal(b, 0), pa.scalar(None, b.type), b)
        if all(pa.types.is_integer(x.type) for x in (a, b)):
            r = pc.subtract(a, pc.multiply(b, pc.divide(a, b)))       # truncated remainder
            fix = pc.and_(pc.not_equal(r, 0), pc.not_equal(pc.less(r, 0), pc.less(b, 0)))
            return pc.if_else(fix, pc.add(r, b), r)
        f64 = pa.float64()
        a, b = pc.cast(a, f64), pc.cast(b, f64)
        return pc.subtract(a, pc.multiply(b, pc.floor(pc.divide(a, b))))

    def py(self, e: Py) -> Any:
        from .exact_arrow import evaluate

        return evaluate(e, self.visit)

    def when(self, e: When) -> Any:
        """``case_when`` over the conditions (null counts as not true), values cast to one type."""
        pc, pa = self.pc, self.pa
        conditions = [self._array(pc.fill_null(self.visit(c), False)) for c, _ in e.cases]
        values = self._common([self.visit(v) for _, v in e.cases] + [self.visit(e.default)])
        return pc.case_when(pa.StructArray.from_arrays(conditions, [f"c{i}" for i in range(len(conditions))]),
                            *values)

    def func(self, e: Func, args: list) -> Any:
        from .strings import evaluate_arrow as strings_arrow

        return strings_arrow(e.name, args, self.batch.num_rows)

    def coalesce(self, e: Coalesce) -> Any:
        return self.pc.coalesce(*self._common([self.visit(a) for a in e.args]))

    def _array(self, x: Any) -> Any:
        """``x`` as an array of the batch's length (a constant repeated)."""
        if isinstance(x, self.pa.Scalar):
            return self.pa.repeat(x, self.batch.num_rows)
        return x.combine_chunks() if isinstance(x, self.pa.ChunkedArray) else x

    def _common(self, xs: list) -> list:
        """``xs`` cast to one type, as Python's values compare (an int among floats is a float;
        a null literal takes the others' type)."""
        pa = self.pa
        types = {x.type for x in xs if x.type != pa.null()}
        if not types:
            return xs
        target = pa.float64() if types <= {pa.int64(), pa.float64()} and len(types) > 1 else types.pop()
        return [x if x.type == target else x.cast(target) for x in xs]

    def unary(self, e: Unary, x: Any) -> Any:
        pc = self.pc
        if e.op in ("is_null", "is_not_null"):
            if isinstance(x, self.pa.Scalar):
                return self.pa.scalar(x.is_valid is (e.op == "is_not_null"))
            return pc.is_null(x) if e.op == "is_null" else pc.is_valid(x)
        return {"neg": pc.negate, "not": pc.invert, "abs": pc.abs}[e.op](x)


def evaluate_arrow(e: Expr, batch: Any) -> Any:
    """``e`` over a ``pyarrow.RecordBatch``: an array of its rows (a scalar if constant)."""
    return _ArrowEval(batch).visit(e)


def run_arrow(steps: Iterable[tuple[str, Any]], batch: Any) -> Any:
    """Apply ``assign``/``where`` steps (see :func:`compile_rows`) to a RecordBatch."""
    import pyarrow as pa

    for kind, arg in steps:
        if kind == "assign":
            arrays = {name: evaluate_arrow(e if isinstance(e, Expr) else Lit(e), batch)
                      for name, e in arg.items()}
            for name, arr in arrays.items():
                if isinstance(arr, pa.Scalar):
                    arr = pa.repeat(arr, batch.num_rows)
                if isinstance(arr, pa.ChunkedArray):
                    arr = arr.combine_chunks()
                i = batch.schema.get_field_index(name)
                batch = (batch.set_column(i, name, arr) if i >= 0 else batch.append_column(name, arr))
        elif kind == "project":
            arrays = [evaluate_arrow(e, batch) for e in arg.values()]
            arrays = [pa.repeat(a, batch.num_rows) if isinstance(a, pa.Scalar) else a for a in arrays]
            batch = pa.RecordBatch.from_arrays(arrays, names=list(arg))
        elif kind == "where" and isinstance(arg, Py):          # a lifted filter keeps what is truthy
            from .exact_arrow import mask

            batch = batch.filter(mask(evaluate_arrow(arg, batch), batch.num_rows))
        elif kind == "where":
            mask = evaluate_arrow(arg, batch)
            if isinstance(mask, pa.Scalar):
                batch = batch if mask.as_py() is True else batch.slice(0, 0)
            else:
                batch = batch.filter(mask)
        else:
            raise TypeError(f"step {kind!r} needs rows, not an Arrow batch")
    return batch

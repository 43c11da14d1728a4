"""A lifted lambda's :class:`~pescheduler.expr.Py` nodes on Arrow arrays, exactly as Python.

Why: a lambda lifted to an expression (``pescheduler.lift``) may run on a
whole ``pyarrow.RecordBatch`` only where Arrow's kernel gives, row for row,
the value the lambda gives. Where it might not -- a null (Python raises on
``None + 1``), a zero divisor (Python raises), an int beyond 2**53 mixed with
floats, an overflowing int, a type pair Python and Arrow treat apart -- the
kernel is not run: :class:`~pescheduler.expr.PythonOnly` is raised, the
chain replays the batch row by row with the user's own function
(``Chain._isolate``), and each row gets exactly its Python result or its
dead letter. Exactness is kept per node, so a batch of clean data runs on
kernels and a dirty one costs what it costs without lifting.
"""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from .errors import PythonOnly

_CHECKED = {"add": pc.add_checked, "sub": pc.subtract_checked, "mul": pc.multiply_checked}
_FLOAT = {"add": pc.add, "sub": pc.subtract, "mul": pc.multiply}
_ORDER = {"eq": pc.equal, "ne": pc.not_equal, "lt": pc.less, "le": pc.less_equal, "gt": pc.greater,
          "ge": pc.greater_equal}


def evaluate(e: Any, visit: Callable[[Any], Any]) -> Any:
    """``e`` over the batch ``visit`` reads (an array, or a scalar where constant)."""
    op = e.op
    if op in ("in", "not_in"):
        return _member(visit(e.args[0]), [a.value for a in e.args[1:]], op)
    args = [visit(a) for a in e.args]
    if op in ("is_none", "is_not_none"):
        return _is_null(args[0], op == "is_none")
    for x in args:
        if _has_null(x):
            raise PythonOnly(f"None reaches {op}")
    if op in ("and", "or", "not", "truth"):
        return _logic(op, args)
    if op in _ORDER:
        return _compare(op, *args)
    return _arithmetic(op, args)


def mask(m: Any, rows: int) -> Any:
    """A lifted filter's result as a filter mask: only a null-free bool is its own truth value."""
    if _kind(m) != "bool" or _has_null(m):
        raise PythonOnly("a filter's value is not a bool")
    return pa.repeat(m, rows) if isinstance(m, pa.Scalar) else m


def _kind(x: Any) -> str:
    t = x.type
    if t == pa.int64():
        return "int"
    if t == pa.float64():
        return "float"
    if t == pa.bool_():
        return "bool"
    return "str" if t in (pa.string(), pa.large_string()) else "other"


def _has_null(x: Any) -> bool:
    return not x.is_valid if isinstance(x, pa.Scalar) else x.null_count > 0


def _any(m: Any) -> bool:
    return bool(m.as_py() if isinstance(m, pa.Scalar) else pc.any(m).as_py())


def _is_null(x: Any, want_null: bool) -> Any:
    if isinstance(x, pa.Scalar):
        return pa.scalar(x.is_valid is not want_null)
    return pc.is_null(x) if want_null else pc.is_valid(x)


def _logic(op: str, args: list) -> Any:
    if any(_kind(x) != "bool" for x in args):
        raise PythonOnly(f"{op} of a value that is not a bool gives an operand, not a bool")
    if op == "not":
        return pc.invert(args[0])
    out = args[0]
    for x in args[1:]:
        out = (pc.and_ if op == "and" else pc.or_)(out, x)
    return out


def _numbers(op: str, a: Any, b: Any, as_float: bool = False) -> tuple[Any, Any, bool]:
    """``(a, b, floats)``: both numbers, cast to float64 when one is (or ``as_float``)."""
    kinds = {_kind(a), _kind(b)}
    if not kinds <= {"int", "float"}:
        raise PythonOnly(f"{op} of {a.type} and {b.type}")
    if kinds == {"int"} and not as_float:
        return a, b, False
    try:        # a safe cast refuses an int beyond 2**53, which float64 would round
        return pc.cast(a, pa.float64()), pc.cast(b, pa.float64()), True
    except pa.ArrowInvalid as exc:
        raise PythonOnly(f"{op}: {exc}") from None


def _compare(op: str, a: Any, b: Any) -> Any:
    kinds = (_kind(a), _kind(b))
    if kinds in (("str", "str"),) or (kinds == ("bool", "bool") and op in ("eq", "ne")):
        return _ORDER[op](a, b)
    a, b, _ = _numbers(op, a, b)
    return _ORDER[op](a, b)


def _arithmetic(op: str, args: list) -> Any:
    if op in ("neg", "abs"):
        x = args[0]
        if _kind(x) not in ("int", "float"):
            raise PythonOnly(f"{op} of {x.type}")
        if op == "neg":
            return pc.negate_checked(x) if _kind(x) == "int" else pc.negate(x)
        return pc.abs_checked(x) if _kind(x) == "int" else pc.abs(x)
    a, b = args
    if op in ("div", "mod"):
        _numbers(op, a, b)
        if _any(pc.equal(b, 0)):
            raise PythonOnly(f"a zero divisor ({op})")
    if op == "div":
        a, b, _ = _numbers(op, a, b, as_float=True)
        return pc.divide(a, b)
    a, b, floats = _numbers(op, a, b)
    if op == "mod":
        if floats:
            raise PythonOnly("% of floats (Python's rounding is its own)")
        r = pc.subtract_checked(a, pc.multiply_checked(b, pc.divide_checked(a, b)))   # truncated
        fix = pc.and_(pc.not_equal(r, 0), pc.not_equal(pc.less(r, 0), pc.less(b, 0)))
        return pc.if_else(fix, pc.add_checked(r, b), r)
    return (_FLOAT if floats else _CHECKED)[op](a, b)


def _member(x: Any, values: list, op: str) -> Any:
    kind = _kind(x)
    exact = (kind == "str" and all(type(v) is str for v in values)) or (
        kind == "int" and all(type(v) is int for v in values))
    if not exact or isinstance(x, pa.Scalar):
        raise PythonOnly(f"{op} of {x.type} over {values!r}")
    found = pc.is_in(x, value_set=pa.array(values, type=x.type))
    return pc.invert(found) if op == "not_in" else found

"""The string functions of ``col`` expressions: one meaning, written once per value, then per backend.

Why a module of its own: SQL engines disagree on strings (SQLite's LENGTH stops at a
NUL and its UPPER maps ASCII only; DuckDB's and SQLite's SUBSTR count a negative start
from the end; PostgreSQL's LIKE escapes with a backslash and its CONCAT skips nulls).
:data:`FUNCTIONS` fixes one meaning, by the Python function that computes it per value;
the Arrow path runs a kernel only where it gives exactly that (else the same Python
per value, :func:`evaluate_arrow`), and :func:`to_sql` writes each database the SQL
that gives it too, or refuses the function there by name (:class:`Unsupported`).

Every function: a null argument gives null; an argument that is not a string where a
string is wanted (a number, a bool) is an error, as comparing a string with a number
is (rows: a dead letter). Lengths and positions count characters (code points), not bytes.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Callable


def _text(name: str, *values: Any) -> None:
    for v in values:
        if not isinstance(v, str):
            raise TypeError(f"{name.upper()} takes text, got {type(v).__name__} {v!r}")


def _int(name: str, v: Any) -> None:
    if type(v) is not int:
        raise TypeError(f"{name.upper()} takes an integer position or length, got {v!r}")


def upper(s: str) -> str:
    """Every letter to upper case by Unicode's full mapping (``"ß"`` -> ``"SS"``), as Python's."""
    _text("upper", s)
    return s.upper()


def lower(s: str) -> str:
    _text("lower", s)
    return s.lower()


def length(s: str) -> int:
    """Characters (code points), not bytes; a NUL counts as one."""
    _text("length", s)
    return len(s)


def substring(s: str, start: int, count: Any = "all") -> str | None:
    """SQL's ``SUBSTRING(s FROM start FOR count)``: characters ``start .. start + count - 1``,
    1-based, of those that exist (a start before 1 shortens what is taken, it does not count
    from the end); no ``count``: to the end. A negative ``count`` is an error in standard SQL;
    here it gives null, as a division by zero does."""
    _text("substring", s)
    _int("substring", start)
    if count == "all":
        return s[max(start, 1) - 1:]
    if count is None:
        return None
    _int("substring", count)
    if count < 0:
        return None
    first = max(start, 1)
    return s[first - 1:max(start + count - 1, first - 1)]


def trim(s: str) -> str:
    """Spaces (only ``' '``, as SQL's TRIM) off both ends."""
    _text("trim", s)
    return s.strip(" ")


def ltrim(s: str) -> str:
    _text("ltrim", s)
    return s.lstrip(" ")


def rtrim(s: str) -> str:
    _text("rtrim", s)
    return s.rstrip(" ")


def concat(*parts: str) -> str:
    """SQL's ``a || b``: null if any part is (``CONCAT(...)`` in SQL skips nulls: the SQL front
    end writes it with COALESCE)."""
    _text("concat", *parts)
    return "".join(parts)


def replace(s: str, old: str, new: str) -> str:
    """Every ``old`` in ``s`` by ``new``; an empty ``old`` changes nothing (SQL's rule: Python
    would put ``new`` between every character)."""
    _text("replace", s, old, new)
    return s if old == "" else s.replace(old, new)


def position(sub: str, s: str) -> int:
    """SQL's ``POSITION(sub IN s)``: the 1-based character where ``sub`` first starts, 0 if
    nowhere; an empty ``sub`` is at 1."""
    _text("position", sub, s)
    return s.find(sub) + 1


def like(s: str, pattern: str) -> bool:
    """SQL's ``s LIKE pattern``: ``%`` any run of characters, ``_`` one character, everything
    else itself (case counts; no escape character: a backslash is a backslash)."""
    _text("like", s, pattern)
    return _like_regex(pattern).fullmatch(s) is not None


@lru_cache(maxsize=256)
def _like_regex(pattern: str) -> re.Pattern:
    parts = {"%": ".*", "_": "."}
    return re.compile("".join(parts.get(c) or re.escape(c) for c in pattern), re.DOTALL)


FUNCTIONS: dict[str, tuple[Callable, int, int]] = {
    "upper": (upper, 1, 1), "lower": (lower, 1, 1), "length": (length, 1, 1),
    "substring": (substring, 2, 3), "trim": (trim, 1, 1), "ltrim": (ltrim, 1, 1), "rtrim": (rtrim, 1, 1),
    "concat": (concat, 2, 64), "replace": (replace, 3, 3), "position": (position, 2, 2), "like": (like, 2, 2),
}
"""name -> (the function on values, least and most arguments)."""


def call(name: str, args: list) -> Any:
    """``name`` on one row's values: null if any argument is (a substring's missing count aside)."""
    for a in args:
        if a is None:
            return None
    return FUNCTIONS[name][0](*args)


# -- Arrow -----------------------------------------------------------------------------------------

def evaluate_arrow(name: str, args: list, rows: int) -> Any:
    """``name`` over Arrow arrays/scalars ``args``: a kernel where it is provably the Python
    function (all-ASCII text for case mapping, constant positions for SUBSTRING, a backslash-free
    constant pattern for LIKE), else that function per row -- the same values, slower."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = pa.int64() if name in ("length", "position") else pa.bool_() if name == "like" else pa.string()
    if any(isinstance(a, pa.Scalar) and not a.is_valid for a in args):      # a null constant
        return pa.scalar(None, kind)
    texts = args[:1] if name == "substring" else args
    if all(a.type in (pa.string(), pa.large_string()) for a in texts) and (
            name != "substring" or all(isinstance(a, pa.Scalar) for a in args[1:])):
        out = _kernel(name, args, pa, pc)
        if out is not None:
            return out
    arrays = [pa.repeat(a, rows) if isinstance(a, pa.Scalar) else a for a in args]
    columns = [a.to_pylist() for a in arrays]
    return pa.array([call(name, list(row)) for row in zip(*columns)] if columns else [], type=kind)


def _kernel(name: str, args: list, pa: Any, pc: Any) -> Any:
    """The kernel giving exactly :data:`FUNCTIONS`' values, or None where there is none."""
    s = args[0]
    if name in ("upper", "lower"):
        if not _ascii(s, pa, pc):
            return None
        return (pc.ascii_upper if name == "upper" else pc.ascii_lower)(s)
    if name == "length":
        return pc.cast(pc.utf8_length(s), pa.int64())
    if name in ("trim", "ltrim", "rtrim"):
        kernel = {"trim": pc.utf8_trim, "ltrim": pc.utf8_ltrim, "rtrim": pc.utf8_rtrim}[name]
        return kernel(s, characters=" ")
    if name == "concat":
        return pc.binary_join_element_wise(*args, "", null_handling="emit_null")
    if name == "substring":
        start, count = args[1].as_py(), (args[2].as_py() if len(args) > 2 else "all")
        if type(start) is not int or (count != "all" and type(count) is not int):
            return None                 # the Python function says what is wrong
        if count != "all" and count < 0:
            return pa.scalar(None, pa.string())
        first = max(start, 1)
        if count == "all":
            return pc.utf8_slice_codeunits(s, first - 1)
        return pc.utf8_slice_codeunits(s, first - 1, max(start + count - 1, first - 1))
    if name == "like" and isinstance(args[1], pa.Scalar) and not isinstance(s, pa.Scalar):
        pattern = args[1].as_py()
        if pattern is None or "\\" in pattern:
            return None
        return pc.match_like(s, pattern)
    return None


def _ascii(x: Any, pa: Any, pc: Any) -> bool:
    if isinstance(x, pa.Scalar):
        return not x.is_valid or x.as_py().isascii()
    return bool(pc.all(pc.string_is_ascii(x)).as_py() is not False)


# -- SQL on the ep databases ----------------------------------------------------------------------

class Unsupported(ValueError):
    """A string function this database would answer differently: run it elsewhere."""


_REFUSED = {
    "sqlite": {
        "upper": "SQLite maps only ASCII letters (Python maps every Unicode letter)",
        "lower": "SQLite maps only ASCII letters (Python maps every Unicode letter)",
        "length": "SQLite counts text only up to its first NUL character",
        "substring": "SQLite cuts text at its first NUL character",
        "position": "SQLite cuts text at its first NUL character",
        "like": "SQLite's LIKE ignores the case of ASCII letters",
    },
    "duckdb": {"upper": "DuckDB maps case by its own Unicode tables ('ß' -> 'ẞ', Python: 'SS')",
               "lower": "DuckDB maps case by its own Unicode tables, not Python's"},
    "postgresql": {"upper": "PostgreSQL maps case by the database's locale, not Unicode's full mapping",
                   "lower": "PostgreSQL maps case by the database's locale, not Unicode's full mapping"},
}


def to_sql(name: str, args: list[str], literals: list, dialect: str) -> str:
    """The SQL computing ``name`` over the SQL texts ``args`` on ``dialect`` (its name);
    ``literals[i]``: the constant argument ``i`` is, or ``...`` when it is not a constant."""
    why = _REFUSED.get(dialect, {}).get(name)
    if why is None and dialect not in ("sqlite", "duckdb", "postgresql"):
        why = "the database is not one whose string functions were checked (SQLite, DuckDB, PostgreSQL)"
    if why is not None:
        raise Unsupported(f"{name.upper()} cannot run on the {dialect} provider: {why}; "
                          f"use the native provider")
    if name == "substring":
        if any(x is ... for x in literals[1:]):
            raise Unsupported(f"SUBSTRING cannot run on the {dialect} provider with a start or length that "
                              f"is not a constant (the positions are written from 1, where engines agree); "
                              f"use the native provider")
        return _substring(args, literals, dialect)
    if name == "concat":
        return "(" + " || ".join(args) + ")"
    if name == "like":
        return f"({args[0]} LIKE {args[1]} ESCAPE '')"
    if name == "length":
        return f"CHAR_LENGTH({args[0]})" if dialect == "postgresql" else f"LENGTH({args[0]})"
    if name == "position":
        return f"POSITION({args[0]} IN {args[1]})"   # the arguments in their order: so are their bound values
    if name in ("trim", "ltrim", "rtrim"):
        return f"{name.upper()}({args[0]}, ' ')"
    return f"{name.upper()}({', '.join(args)})"


_MOST = {"postgresql": 2 ** 31 - 1, "duckdb": 2 ** 32 - 1}
"""The largest position each database's SUBSTR takes, past which no character of its text exists:
PostgreSQL's takes ``integer`` positions (a larger constant is a ``bigint``: no such function) and
its text holds at most 1 GB; DuckDB's raises "outside of supported range" past 2^32-1, the most
bytes its strings hold."""


def _substring(args: list[str], literals: list, dialect: str) -> str:
    """Positions only as constants, turned into a start of at least 1 and a count of at least 0,
    where every engine agrees (DuckDB and SQLite count a start below 1 from the end); on PostgreSQL
    at most the database's :data:`_MOST`."""
    start, count = literals[1], literals[2] if len(literals) > 2 else "all"
    for v in (start, count):
        if v is not None and v != "all":
            _int("substring", v)
    if start is None or count is None or (count != "all" and count < 0):
        return f"(CASE WHEN FALSE THEN {args[0]} END)"     # null text; the text's own placeholders are kept
    first = max(start, 1)
    taken = None if count == "all" else max(start + count - first, 0)
    most = _MOST.get(dialect)
    if most is not None:
        first, taken = min(first, most), taken if taken is None else min(taken, most)
    if taken is None:
        return f"SUBSTR({args[0]}, {first})"
    return f"SUBSTR({args[0]}, {first}, {taken})"

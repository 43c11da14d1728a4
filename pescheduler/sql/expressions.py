"""sqlglot scalar expressions to ``col`` expression trees (:mod:`pescheduler.expr`).

Only what the tree computes exactly as SQL does is translated; everything
else is a :class:`~pescheduler.sql.parse.SQLError` naming the construct and
its place. Not translated, on purpose:

* ``%`` / ``MOD``: the tree's modulo is Python's floor modulo, SQL's truncates
  (``-7 % 3`` is 2 against -1): translating it would give wrong results;
* ``TRIM`` of other characters than spaces, ``ILIKE``, ``LIKE ... ESCAPE`` and
  ``POSITION`` from a start: the tree's string functions do not have them.

``CASE WHEN`` (and ``CASE x WHEN v``), ``IF(c, a, b)``, ``COALESCE`` and ``NULLIF``
become the tree's ``when``/``coalesce`` (a null condition is not true, as in SQL).
The string functions (``UPPER``, ``LOWER``, ``LENGTH``/``CHAR_LENGTH``,
``SUBSTRING``/``SUBSTR``, ``TRIM``/``LTRIM``/``RTRIM``, ``||``, ``CONCAT``,
``REPLACE``, ``POSITION``/``STRPOS``, ``LIKE``) become the tree's
(:mod:`pescheduler.strings`: SQL's meaning, null in, null out). ``CONCAT(a, b)``
skips nulls as PostgreSQL's and DuckDB's do (``||`` gives null).
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

from ..expr import Coalesce, Expr, Func, Lit, Unary, When, col, lit, nullif
from .parse import error

_BINARY: dict[type, Callable[[Expr, Expr], Expr]] = {
    exp.Add: lambda a, b: a + b, exp.Sub: lambda a, b: a - b, exp.Mul: lambda a, b: a * b,
    exp.Div: lambda a, b: a / b, exp.EQ: lambda a, b: a == b, exp.NEQ: lambda a, b: a != b,
    exp.LT: lambda a, b: a < b, exp.LTE: lambda a, b: a <= b, exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b, exp.And: lambda a, b: a & b, exp.Or: lambda a, b: a | b,
}
_UNARY: dict[type, Callable[[Expr], Expr]] = {
    exp.Neg: lambda a: -a, exp.Not: lambda a: ~a, exp.Abs: abs,
}
_STRINGS: dict[type, str] = {exp.Upper: "upper", exp.Lower: "lower", exp.Length: "length",
                              exp.Replace: "replace"}
_WHY_NOT = {
    exp.ILike: "ILIKE's case folding is not one across engines; compare LOWER(x) LIKE ...",
    exp.Escape: "LIKE has no escape character here ('%' and '_' are always wildcards)",
    exp.Mod: "the expression tree's % is floor modulo and SQL's truncates, so it would give wrong "
             "results on negative numbers",
}


class Translator:
    """Translates the scalar expressions of one query; ``names`` maps a sub-tree's SQL text to a
    field already computed under that name (aggregates, read after the window); ``qualified``:
    the query joins two sources, so every column names its side (``a.k``: the joined row's field)."""

    def __init__(self, query: str, names: dict[str, str] | None = None, qualified: bool = False) -> None:
        self.query = query
        self.names = names or {}
        self.qualified = qualified

    def __call__(self, node: exp.Expression) -> Expr:
        if node.sql() in self.names:
            return col(self.names[node.sql()])
        for kind, build in _BINARY.items():
            if type(node) is kind:
                return build(self(node.this), self(node.expression))
        if type(node) in _UNARY:
            return _UNARY[type(node)](self(node.this))
        return self._leaf_or_special(node)

    def _leaf_or_special(self, node: exp.Expression) -> Expr:
        if isinstance(node, exp.Paren):
            return self(node.this)
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, (exp.Literal, exp.Boolean, exp.Null)):
            return self._literal(node)
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            return Unary("is_null", self(node.this))
        if isinstance(node, exp.Between):
            value = self(node.this)
            return (value >= self(node.args["low"])) & (value <= self(node.args["high"]))
        if isinstance(node, exp.In) and node.expressions and not node.args.get("query"):
            return self._in(node)
        if isinstance(node, (exp.Case, exp.If, exp.Coalesce)):
            return self._conditional(node)
        if isinstance(node, exp.Nullif):
            return nullif(self(node.this), self(node.expression))
        return self._string(node)

    def _string(self, node: exp.Expression) -> Expr:
        """The string functions, as the tree's :class:`~pescheduler.expr.Func` nodes."""
        if type(node) in _STRINGS:
            args = [node.this] + [node.args[k] for k in ("expression", "replacement") if node.args.get(k)]
            return Func(_STRINGS[type(node)], *(self(a) for a in args))
        if isinstance(node, exp.Substring):
            args = [node.this, node.args["start"]] + ([node.args["length"]] if node.args.get("length") else [])
            return Func("substring", *(self(a) for a in args))
        if isinstance(node, exp.Trim) and not node.args.get("expression") and not node.args.get("collation"):
            side = (node.args.get("position") or "BOTH").upper()
            return Func({"BOTH": "trim", "LEADING": "ltrim", "TRAILING": "rtrim"}[side], self(node.this))
        if isinstance(node, exp.DPipe):
            return Func("concat", self(node.this), self(node.expression))
        if isinstance(node, exp.Concat):         # CONCAT skips nulls (PostgreSQL's and DuckDB's rule)
            return Func("concat", *(Coalesce(self(a), "") for a in node.expressions), "")
        if isinstance(node, exp.StrPosition) and not node.args.get("position"):
            return Func("position", self(node.args["substr"]), self(node.this))
        if isinstance(node, exp.Like) and not isinstance(node.expression, exp.Escape):
            found = self(node.this).like(self(node.expression))
            return ~found if node.args.get("negate") else found
        raise self.unsupported(node)

    def _conditional(self, node: exp.Expression) -> Expr:
        """``CASE``/``IF``/``COALESCE`` as the tree's ``When``/``Coalesce``."""
        if isinstance(node, exp.Coalesce):
            return Coalesce(self(node.this), *(self(a) for a in node.expressions))
        if isinstance(node, exp.If):
            false = node.args.get("false")
            return When(((self(node.this), self(node.args["true"])),),
                        lit(None) if false is None else self(false))
        subject = node.this            # CASE x WHEN v THEN ...: x = v per case
        cases = tuple(((self(subject) == self(branch.this)) if subject is not None else self(branch.this),
                       self(branch.args["true"])) for branch in node.args["ifs"])
        default = node.args.get("default")
        return When(cases, lit(None) if default is None else self(default))

    def _column(self, node: exp.Column) -> Expr:
        if self.qualified:
            if not node.table:
                raise error(self.query, node, f"column {node.sql()!r}: a JOIN's query names the side of "
                                              f"each field (a.{node.name})")
            return col(f"{node.table}.{node.name}")
        if node.table:
            raise error(self.query, node, f"qualified column {node.sql()!r}: name the field alone "
                                          f"(a query reads one table per SELECT)")
        return col(node.name)

    def _literal(self, node: exp.Expression) -> Lit:
        if isinstance(node, exp.Null):
            return lit(None)
        if isinstance(node, exp.Boolean):
            return lit(bool(node.this))
        if node.is_string:
            return lit(node.this)
        text = node.this
        return lit(float(text) if any(c in text for c in ".eE") else int(text))

    def _in(self, node: exp.In) -> Expr:
        value = self(node.this)
        tests = [value == self(option) for option in node.expressions]
        result = tests[0]
        for test in tests[1:]:
            result = result | test
        return result

    def unsupported(self, node: exp.Expression) -> Exception:
        """The error for a construct with no translation (why, when known)."""
        what = node.name.upper() if isinstance(node, exp.Anonymous) else (
            node.sql_name() if isinstance(node, exp.Func) else node.key.upper())
        why = _WHY_NOT.get(type(node), "not supported by pescheduler's SQL (see docs/sql.md)")
        return error(self.query, node, f"{what} is not supported: {why}")

"""Text to a checked sqlglot tree, and where a node is in the text (for errors).

Flink writes a window table function as
``TABLE(TUMBLE(TABLE cars, DESCRIPTOR(ts), INTERVAL '60' SECOND))``, which
sqlglot does not parse; its short form ``TUMBLE(cars, ts, INTERVAL '60'
SECOND)`` it does. :func:`parse` blanks the Flink decorations out (``TABLE(``
and its ``)``, ``TABLE`` before the table's name, ``DESCRIPTOR(`` and its
``)``) with spaces of the same length, so every position sqlglot reports is
still the position in the text the user wrote.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp

from ..errors import InvalidApplication

WINDOW_FUNCTIONS = {"TUMBLE": "tumble", "HOP": "hop", "SESSWIN": "session"}
"""The window table functions as sqlglot sees them -> their kind. SESSION is a keyword to sqlglot:
:func:`parse` renames the call ``SESSWIN`` (as long, so positions hold)."""
_TABLE_CALL = re.compile(r"\bTABLE\s*\(\s*(?=(?:TUMBLE|HOP|SESSION)\s*\()", re.I)
_SESSION_CALL = re.compile(r"\bSESSION(?=\s*\()", re.I)
_TABLE_ARG = re.compile(r"(?<=\()(\s*)TABLE\b", re.I)
_DESCRIPTOR = re.compile(r"\bDESCRIPTOR\s*\(", re.I)


class SQLError(InvalidApplication):
    """A query pescheduler cannot run: what and where (``line``, ``column``, 1-based)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        self.line, self.column = line, column
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(f"{message}{where}")


def parse(query: str) -> exp.Expression:
    """One SELECT (or UNION ALL of SELECTs) as a sqlglot tree; a syntax error is a :class:`SQLError`."""
    text = normalise(query)
    try:
        trees = sqlglot.parse(text)
    except sqlglot.errors.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        raise SQLError(f"syntax error: {first.get('description', exc)}", first.get("line"),
                       first.get("col")) from None
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise SQLError(f"expected one query, got {len(trees)} statements")
    return trees[0]


def normalise(query: str) -> str:
    """The query with Flink's window-TVF decorations replaced by spaces (positions kept)."""
    chars = list(query)
    for pattern in (_TABLE_CALL, _DESCRIPTOR):
        for match in pattern.finditer(query):
            _blank(chars, match.start(), match.end())
            close = _matching(query, match.end() - 1 if query[match.end() - 1] == "(" else match.end())
            if close is not None:
                chars[close] = " "
    for match in _TABLE_ARG.finditer(query):
        _blank(chars, match.start(1) + len(match.group(1)), match.end())
    for match in _SESSION_CALL.finditer(query):
        chars[match.start():match.end()] = "SESSWIN"
    return "".join(chars)


def _blank(chars: list[str], start: int, end: int) -> None:
    for i in range(start, end):
        if chars[i] != "\n":
            chars[i] = " "


def _matching(text: str, open_at: int) -> int | None:
    """The index of the ``)`` closing the ``(`` at ``open_at`` (quotes skipped)."""
    depth, quoted = 0, False
    for i in range(open_at, len(text)):
        c = text[i]
        if c == "'":
            quoted = not quoted
        elif not quoted and c == "(":
            depth += 1
        elif not quoted and c == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def position(node: exp.Expression, query: str) -> tuple[int | None, int | None]:
    """``(line, column)`` of ``node``'s first token in ``query`` (1-based), if sqlglot kept it."""
    starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
    if not starts:
        return None, None
    start = min(starts)
    if "start" not in node.meta:        # a keyword sqlglot keeps no place for (CASE): the word before
        word = node.sql_name() if isinstance(node, exp.Func) else node.key.upper()
        at = query.upper().rfind(word, 0, start)
        start = at if at >= 0 and "\n" not in query[at:start] and start - at < 40 else start
    return query.count("\n", 0, start) + 1, start - query.rfind("\n", 0, start)


def error(query: str, node: exp.Expression, message: str) -> SQLError:
    """A :class:`SQLError` placed at ``node``."""
    return SQLError(message, *position(node, query))

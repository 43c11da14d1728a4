"""Equal keys hidden in a correlation predicate: a hash join's keys where an equation gives them.

Pure algebra over the project's one expression tree (:mod:`pescheduler.expr`),
used where a correlation is planned (``ep/api.py``, the SQL bridge) and where
it runs (``operators/ep_correlate.py``): it sits beside the tree so the
operators need nothing of the ``ep`` package that builds them.
"""

from __future__ import annotations

from typing import Any, Callable

from .expr import Binary, Col, Expr, Lit, Unary, conjuncts


def signed_terms(e: Expr, sign: int, out: list) -> None:
    """``e`` as a signed sum: ``[(sign, term)]`` through ``+`` and ``-``."""
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        signed_terms(e.left, sign, out)
        signed_terms(e.right, sign if e.op == "add" else -sign, out)
    else:
        out.append((sign, e))


def sum_of_terms(terms: list, side: str) -> Expr:
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
        signed_terms(c.left, 1, terms)
        signed_terms(c.right, -1, terms)
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
                return (sum_of_terms(sides["left"] + sides["const"], "left"),
                        sum_of_terms([(-sign, t) for sign, t in sides["right"]], "right"))
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

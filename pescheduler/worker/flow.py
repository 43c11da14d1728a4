"""What a PE may take in while one of its output channels is full: no credit deadlock.

The operator graph has no cycle, but the PE graph can: fusing non-adjacent
operators makes two PEs feed each other, and a copy of a MERGEABLE operator
(a window) sends its partials back to the PE of its original, which feeds the
copy. With credit-based channels, a PE that stops taking input while it waits
for credit on an output stops granting credit to its senders; around such a
cycle each PE then waits for the other forever (issue 20: a copied window at
overload, every PE at backpressure 1.0, 0 tuples/s).

The rule, applied by the PE loop: an output channel is *full* when it is out
of credit with ``RELIEF_BATCHES`` credit windows buffered. While some are,
the PE keeps taking every input (channel or source) except those whose
operators reach the producer of a full channel inside the PE (taking those
would grow the full channel's buffer without bound); the others it takes,
and grants their credit, as usual.

Why this cannot deadlock: say PEs ``P1 .. Pn = P1`` each wait on the next,
``Pi`` with a full channel from its operator ``u_i`` to ``v_i`` in ``P(i+1)``,
which does not take it. By the rule ``v_i`` reaches ``u_(i+1)`` inside
``P(i+1)``, so ``u_1 -> v_1 ->* u_2 -> v_2 ->* ... ->* u_1`` is a cycle of the
operator graph, which has none (a copy's partials go to its original, which
feeds nothing back to the copy). tests/unit/test_flow.py checks this on every
placement random transforms produce, with this very function.

With the Aligner (aligner.py): an aligning PE parks what a channel brings
after its marker and grants no credit for it, which could starve a sender
this rule counts on. A reconfiguration never parks: every input of a PE being
replaced is held by its sender right after the marker, and a held channel is
never full (it waits for the rewire, not for credit), so markers travel as
batches do in the model above (tests/unit/test_flow.py checks the holds on
every reconfiguration random transforms produce). A checkpoint barrier, whose
senders go on, parks by design; it must keep to the same argument.
"""

from __future__ import annotations

from typing import Iterable

Edge = tuple[str, str, str]          # (producer, port, consumer) with the consumer in the PE


def downstream(edges: Iterable[Edge], start: Iterable[str]) -> set[str]:
    """``start`` and every operator reachable from it along ``edges``."""
    succ: dict[str, set[str]] = {}
    for src, _port, dst in edges:
        succ.setdefault(src, set()).add(dst)
    seen = set(start)
    todo = list(seen)
    while todo:
        for nxt in succ.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def feeds(edges: list[Edge], members: Iterable[str], op_id: str, port: str, full: Iterable[str]) -> bool:
    """Would taking ``op_id.port``'s input (a channel from another PE, or ``op_id`` itself when it
    is a source among ``members``) emit, inside the PE, into an output of an operator in ``full``?"""
    full = set(full)
    if not full:
        return False
    start = [op_id] if op_id in set(members) else [d for s, p, d in edges if s == op_id and p == port]
    return not full.isdisjoint(downstream(edges, start))

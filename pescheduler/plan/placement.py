"""Plans are data: the logical plan (what the user wrote) and the placement (what runs where).

Both are frozen: a graph transform (fuse, split, move, replicate) is a function
from one placement to a new one, so each is testable on its own and the
runtime only ever applies a difference between two placements.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ..operator import Parallelism
from .routing import Route


@dataclass(frozen=True)
class LogicalOp:
    """An operator of the logical plan, resolved to its class and checked."""

    op_id: str
    kind: str
    name: str
    cls: type
    params: Mapping[str, Any]
    inputs: tuple[tuple[str, str], ...]          # (upstream op_id, port)
    key_field: str | Callable | None = None
    copy_of: str | None = None                   # set on copies ``X#k`` of operator ``X``

    @property
    def parallelism(self) -> Parallelism:
        return self.cls.parallelism


@dataclass(frozen=True)
class LogicalPlan:
    """Operators in topological order and the edges ``(src, port, dst)`` between them."""

    app_name: str
    ops: Mapping[str, LogicalOp]
    edges: tuple[tuple[str, str, str], ...]

    def upstream(self, op_id: str) -> list[str]:
        return [s for s, _p, d in self.edges if d == op_id]

    def downstream(self, op_id: str) -> list[str]:
        return [d for s, _p, d in self.edges if s == op_id]

    @property
    def order(self) -> list[str]:
        """Operator ids in topological order (sources first)."""
        return list(self.ops)


@dataclass(frozen=True)
class PE:
    """A processing element: fused operators on one worker (``copy_of`` set for copies)."""

    operators: tuple[str, ...]
    worker: str = ""
    host: str = ""
    copy_of: str | None = None


@dataclass(frozen=True)
class Slot:
    """A standard slot: a warm place on ``worker`` where copies of hot operators run.

    ``copies`` are the copy operators (``X#k``) it holds now; a slot may hold
    copies of several operators, and is free when it holds none.
    """

    worker: str
    host: str = ""
    copies: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """operators -> PEs -> workers -> hosts. ``pes`` keeps PE ids in a stable order.

    ``plan`` is the *physical* plan: the operators the user wrote plus their
    copies. A copy of operator ``X`` is operator ``X#k`` (``LogicalOp.copy_of
    == "X"``) with the same edges as ``X``, run by a PE whose ``copy_of`` is
    ``"X"``. ``slots`` are the standard slots copies are placed on.
    """

    plan: LogicalPlan
    pes: Mapping[str, PE]
    workers: tuple[str, ...] = ()
    hosts: Mapping[str, str] = field(default_factory=dict)    # worker -> host id
    slots: Mapping[str, Slot] = field(default_factory=dict)   # slot id -> slot
    routes: Mapping[str, Route] = field(default_factory=dict)  # copied operator -> how instances share

    def copies_of(self, op_id: str) -> list[str]:
        """The copy operators of ``op_id`` (``X#1``, ``X#2``, ...), oldest first."""
        return [o for o, op in self.plan.ops.items() if op.copy_of == op_id]

    def instances(self, op_id: str) -> list[str]:
        """``op_id`` and its copies: every operator instance doing ``op_id``'s work."""
        return [op_id] + self.copies_of(op_id)

    def pe_of(self, op_id: str) -> str:
        """The PE that runs ``op_id``."""
        for pe_id, pe in self.pes.items():
            if op_id in pe.operators:
                return pe_id
        raise KeyError(f"operator {op_id!r} is in no PE")

    def with_pes(self, pes: Mapping[str, PE]) -> "Placement":
        return replace(self, pes=MappingProxyType(dict(pes)))

    def channels(self) -> list[tuple[str, str, str, str]]:
        """Edges that cross PEs: ``(src_op, port, dst_op, dst_pe)``."""
        where = {op: pe_id for pe_id, pe in self.pes.items() for op in pe.operators}
        return [(s, p, d, where[d]) for s, p, d in self.plan.edges if where[s] != where[d]]


def pe_name(plan: LogicalPlan, operators: list[str] | tuple[str, ...]) -> str:
    """A readable PE id: its operators in topological order joined by ``->``."""
    order = {op: i for i, op in enumerate(plan.ops)}
    return "->".join(sorted(operators, key=order.__getitem__))

"""Plans are data: the logical plan (what the user wrote) and the physical plan (what runs where).

Both are frozen: a graph transform (fuse, split, move, replicate) is a function
from one physical plan to a new one, so each is testable on its own and the
runtime only ever applies a difference between two plans.

The physical plan (:class:`PhysicalPlan`; ``Placement`` is its public name,
the one policies and ``Deployment.placement()`` use) holds operator
*instances*: each operator of the logical plan, and its copies ``X#k``. The
copy map (copy -> original) is its one record of copies; the instance graph
(``placement.plan``: instances and the edges between them) and the
operator -> PE index (:meth:`PhysicalPlan.pe_of`) are derived from it once
per plan.

PE ids: a PE's id is its display name, its operators in topological order
joined by ``->`` (``filter-3->key_by-4``), or a copy's own operator id. It is
stable for exactly as long as the PE is the same PE: a Move keeps it; a fuse
or split makes different PEs (the runtime retires the old ones and launches
new ones, state moved), and those get the ids of their new operator sets.
Ids are opaque: nothing parses one back into operators (use ``pes[id].operators``
or ``pe_of``). Users, the CLI, tests and policies name PEs by these ids
(``Split("filter-3->key_by-4->window-5->jsonl-6", [...])``), so a second,
numeric id would only be one more name to translate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ..operator import Parallelism
from .routing import Route


class _Graph:
    """Graph queries shared by the logical plan and the instance graph."""

    ops: Mapping[str, Any]
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
class LogicalOp:
    """An operator of the logical plan, resolved to its class and checked."""

    op_id: str
    kind: str
    name: str
    cls: type
    params: Mapping[str, Any]
    inputs: tuple[tuple[str, str], ...]          # (upstream op_id, port)
    key_field: str | Callable | None = None

    @property
    def parallelism(self) -> Parallelism:
        return self.cls.parallelism


@dataclass(frozen=True)
class LogicalPlan(_Graph):
    """Operators in topological order and the edges ``(src, port, dst)`` between them."""

    app_name: str
    ops: Mapping[str, LogicalOp]
    edges: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class OpInstance:
    """An operator instance of the physical plan: a user's operator (``copy_of`` None) or a
    copy ``X#k`` of operator ``X`` (``copy_of == "X"``), which does ``X``'s work."""

    op_id: str
    op: LogicalOp
    copy_of: str | None = None

    @property
    def original(self) -> str:
        """The logical operator whose work this instance does."""
        return self.copy_of or self.op_id

    @property
    def kind(self) -> str:
        return self.op.kind

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def cls(self) -> type:
        return self.op.cls

    @property
    def params(self) -> Mapping[str, Any]:
        return self.op.params

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        return self.op.inputs

    @property
    def key_field(self) -> str | Callable | None:
        return self.op.key_field

    @property
    def parallelism(self) -> Parallelism:
        return self.op.cls.parallelism


@dataclass(frozen=True)
class InstanceGraph(_Graph):
    """Operator instances in topological order (a copy right after its original and older
    copies) and the edges between them."""

    app_name: str
    ops: Mapping[str, OpInstance]
    edges: tuple[tuple[str, str, str], ...]


def instance_graph(logical: LogicalPlan, copies: Mapping[str, str]) -> InstanceGraph:
    """The user's operators plus ``copies`` (copy id -> original), edges expanded.

    A copy has its original's inputs and outputs, except a MERGEABLE copy,
    whose only output feeds its partials to the original.
    """
    of: dict[str, list[str]] = {o: [o] for o in logical.ops}
    for c, o in copies.items():
        of[o].append(c)
    ops = {}
    for o, op in logical.ops.items():
        ops[o] = OpInstance(o, op)
        for c in of[o][1:]:
            ops[c] = OpInstance(c, op, copy_of=o)
    mergeable = {o for o, op in logical.ops.items() if op.parallelism is Parallelism.MERGEABLE}
    edges = []
    for s, p, d in logical.edges:
        senders = [s] if s in mergeable else of[s]
        edges.extend((s2, p, d2) for s2 in senders for d2 in of[d])
    edges.extend((c, "out", o) for o in mergeable for c in of[o][1:])
    return InstanceGraph(logical.app_name, MappingProxyType(ops), tuple(edges))


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
class PhysicalPlan:
    """operator instances -> PEs -> workers -> hosts, standard slots and routes.

    ``logical`` is the plan the user wrote; ``copies`` the copy map (copy
    ``X#k`` -> ``X``, oldest first); ``plan`` the instance graph derived from
    both. A copy runs in a PE of its own whose ``copy_of`` is ``"X"``, on a
    standard slot (``slots``). ``pes`` keeps PE ids in a stable order.
    """

    logical: LogicalPlan
    pes: Mapping[str, PE]
    workers: tuple[str, ...] = ()
    hosts: Mapping[str, str] = field(default_factory=dict)    # worker -> host id
    slots: Mapping[str, Slot] = field(default_factory=dict)   # slot id -> slot
    routes: Mapping[str, Route] = field(default_factory=dict)  # copied operator -> how instances share
    copies: Mapping[str, str] = field(default_factory=dict)   # copy op -> original, oldest first
    latency_s: float = 0.0    # the latency target every channel sizes its batches by (worker/channels.py)

    @cached_property
    def plan(self) -> InstanceGraph:
        """The operator instances (originals and copies) and the edges between them."""
        return instance_graph(self.logical, self.copies)

    @cached_property
    def _pe_index(self) -> dict[str, str]:
        return {op: pe_id for pe_id, pe in self.pes.items() for op in pe.operators}

    def copies_of(self, op_id: str) -> list[str]:
        """The copy operators of ``op_id`` (``X#1``, ``X#2``, ...), oldest first."""
        return [c for c, o in self.copies.items() if o == op_id]

    def instances(self, op_id: str) -> list[str]:
        """``op_id`` and its copies: every operator instance doing ``op_id``'s work."""
        return [op_id] + self.copies_of(op_id)

    def original(self, op_id: str) -> str:
        """The operator whose work ``op_id`` does (itself, or the original of a copy)."""
        return self.copies.get(op_id, op_id)

    def pe_of(self, op_id: str) -> str:
        """The PE that runs ``op_id``."""
        try:
            return self._pe_index[op_id]
        except KeyError:
            raise KeyError(f"operator {op_id!r} is in no PE") from None

    def pe_operators(self, pe_id: str) -> tuple[str, ...]:
        """The operators of PE ``pe_id``; for a PE not in this plan, the operators its id names
        (a policy may name the PE a fuse earlier in the same round will make), or ``(pe_id,)``."""
        pe = self.pes.get(pe_id)
        if pe is not None:
            return pe.operators
        return named_operators(self.plan, pe_id) or (pe_id,)

    def with_pes(self, pes: Mapping[str, PE]) -> "PhysicalPlan":
        return replace(self, pes=MappingProxyType(dict(pes)))

    def channels(self) -> list[tuple[str, str, str, str]]:
        """Edges that cross PEs: ``(src_op, port, dst_op, dst_pe)``."""
        where = self._pe_index
        return [(s, p, d, where[d]) for s, p, d in self.plan.edges if where[s] != where[d]]


Placement = PhysicalPlan      # the public name (policies, Deployment.placement(), hookspecs)


def pe_name(plan: _Graph, operators: list[str] | tuple[str, ...]) -> str:
    """A readable PE id: its operators in topological order joined by ``->``."""
    order = {op: i for i, op in enumerate(plan.ops)}
    return "->".join(sorted(operators, key=order.__getitem__))


def named_operators(plan: _Graph, pe_id: str) -> tuple[str, ...]:
    """The inverse of :func:`pe_name`: the plan's operators whose ``->`` join is ``pe_id``, or ()
    if there are none. Matched against known operator ids in topological order (not split on
    ``->``), so an operator id that itself contains ``->`` is read right."""
    ops = list(plan.ops)

    def match(rest: str, start: int) -> tuple[str, ...] | None:
        for j in range(start, len(ops)):
            o = ops[j]
            if rest == o:
                return (o,)
            if rest.startswith(o + "->"):
                tail = match(rest[len(o) + 2:], j + 1)
                if tail is not None:
                    return (o,) + tail
        return None

    return match(pe_id, 0) or ()

"""App graph -> logical plan -> placement, as a short list of phases.

Read :data:`PHASES` to know the compiler::

    validate  resolve operator names to classes, check parameters and the graph's shape
    annotate  hand key fields from key_by to the keyed operators that follow
    fuse      one PE per worker slot; with more operators than slots, fuse
              neighbours, starting from the sink end (IBM's guideline when no
              history exists: traffic shrinks along filters)
    place     spread PEs over workers in topological order; standard slots on every host

Each phase is a typed function ``(input, context) -> output`` (the output of
one is the input of the next: ``Application -> LogicalPlan -> LogicalPlan ->
Placement -> Placement``) and logs what it did on ``pescheduler.plan.compiler``
at INFO.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable

from .. import config
from .app import Application
from ..errors import InvalidApplication
from ..operator import Parallelism
from .placement import PE, LogicalOp, LogicalPlan, Placement
from ..plugins import Plugins, UnknownOperatorError
from .transforms import can_fuse, fused, with_slots

logger = logging.getLogger(__name__)


@dataclass
class CompileContext:
    """What the phases need besides the graph: plug-ins and the workers to place on."""

    plugins: Plugins
    workers: tuple[str, ...]
    hosts: dict[str, str]
    latency_s: float = 0.0      # the deployment's latency target, carried in the placement


def validate(app: Application, ctx: CompileContext) -> LogicalPlan:
    """Resolve every operator, instantiate it once to check parameters, check the shape."""
    if not app.nodes:
        raise InvalidApplication(f"application {app.name!r} is empty: add a source with app.source(...)")
    ops = {}
    for node in app.nodes.values():
        try:
            cls = ctx.plugins.operator(node.name, node.kind)
        except UnknownOperatorError as exc:
            raise InvalidApplication(f"{node.op_id}: {exc}") from None
        try:
            cls(**node.params)
        except (TypeError, ValueError) as exc:
            raise InvalidApplication(f"{node.op_id}: {exc}") from None
        ops[node.op_id] = LogicalOp(node.op_id, node.kind, node.name, cls,
                                    MappingProxyType(dict(node.params)), tuple(node.inputs),
                                    node.key_field)
    _check_shape(app, ops)
    edges = tuple((src, port, op.op_id) for op in ops.values() for src, port in op.inputs)
    plan = LogicalPlan(app.name, MappingProxyType(_topological(ops)), edges)
    logger.info("validate %s: %d operators, %d edges, in order %s", app.name, len(plan.ops), len(edges),
                " ".join(plan.ops))
    return plan


def _check_shape(app: Application, ops: dict[str, LogicalOp]) -> None:
    if not any(op.kind == "source" for op in ops.values()):
        raise InvalidApplication(f"application {app.name!r} has no source: start with app.source(...)")
    if not any(op.kind == "sink" for op in ops.values()):
        raise InvalidApplication(
            f"application {app.name!r} has no sink, so its results go nowhere: "
            f"end a stream with .sink('jsonl', path=...) or .sink('print')")
    for op in ops.values():
        for src, port in op.inputs:
            declared = ("out",) + tuple(ops[src].cls.outputs)
            if port not in declared:
                raise InvalidApplication(f"{op.op_id} reads port {port!r} of {src}, which only has {declared}")
        if op.kind != "sink" and not app.consumers(op.op_id):
            raise InvalidApplication(
                f"the output of {op.op_id} is not used: add .sink(...) after it or remove it")


def _topological(ops: dict[str, LogicalOp]) -> dict[str, LogicalOp]:
    # Apps are built by appending, so insertion order is already topological;
    # sort anyway so hand-built plans work too.
    done: dict[str, LogicalOp] = {}
    pending = list(ops.values())
    while pending:
        ready = [op for op in pending if all(src in done for src, _ in op.inputs)]
        if not ready:
            raise InvalidApplication(f"the graph has a cycle among {[op.op_id for op in pending]}")
        for op in ready:
            done[op.op_id] = op
            pending.remove(op)
    return done


def annotate(plan: LogicalPlan, ctx: CompileContext) -> LogicalPlan:
    """Keyed operators learn their key field from the key_by they follow, or their own ``key=``."""
    ops = dict(plan.ops)
    for op_id, op in ops.items():
        if op.key_field is None:
            keys = {ops[src].key_field for src, _ in op.inputs if ops[src].name == "key_by"}
            keys |= {ops[src].params.get("field") for src, _ in op.inputs if ops[src].name == "key_by"}
            keys.discard(None)
            if len(keys) == 1:
                ops[op_id] = replace(op, key_field=keys.pop())
            elif not keys and op.parallelism is Parallelism.KEYED and op.params.get("key") is not None:
                ops[op_id] = replace(op, key_field=op.params["key"])     # window(key=...), pattern(key=...)
    keyed = {o: op.key_field for o, op in ops.items() if op.key_field is not None and plan.ops[o].key_field is None}
    logger.info("annotate %s: key fields %s", plan.app_name,
                ", ".join(f"{o} <- {k!r}" for o, k in keyed.items()) or "none added")
    return replace(plan, ops=MappingProxyType(ops))


def fuse(plan: LogicalPlan, ctx: CompileContext) -> Placement:
    """Group operators into PEs (not yet on workers), at most one PE per worker slot.

    Starts from one PE per operator and fuses, across the edge nearest a sink
    first, pairs that :func:`~pescheduler.plan.transforms.can_fuse` allows.
    """
    placement = Placement(plan, MappingProxyType({op: PE((op,)) for op in plan.ops}))
    slots = max(1, len(ctx.workers))
    depth = _depth_to_sink(plan)
    while len(placement.pes) > slots:
        pair = _edge_nearest_sink(placement, depth)
        if pair is None:
            break
        placement = fused(placement, *pair)
    logger.info("fuse %s: %d PEs for %d worker(s): %s", plan.app_name, len(placement.pes), slots,
                " | ".join(placement.pes))
    return placement


def _depth_to_sink(plan: LogicalPlan) -> dict[str, int]:
    """Longest path from each operator to a sink (0 for sinks)."""
    depth: dict[str, int] = {}
    for op_id in reversed(plan.order):
        below = plan.downstream(op_id)
        depth[op_id] = 1 + max(depth[d] for d in below) if below else 0
    return depth


def _edge_nearest_sink(placement: Placement, depth: dict[str, int]) -> tuple[str, str] | None:
    """The PEs joined by the edge whose consumer is closest to a sink (and that may fuse),
    the one holding the earlier operator first."""
    plan = placement.logical
    best = None
    for src, _port, dst in plan.edges:
        a, b = placement.pe_of(src), placement.pe_of(dst)
        if a == b:
            continue
        rank = (depth[dst], -plan.order.index(dst))
        if (best is None or rank < best[0]) and can_fuse(placement, a, b) is None:
            first = min((a, b), key=lambda p: plan.order.index(placement.pes[p].operators[0]))
            best = (rank, (first, b if first == a else a))
    return None if best is None else best[1]


def place(placement: Placement, ctx: CompileContext) -> Placement:
    """Spread the PEs over the workers in topological order, one per worker while they last."""
    if not ctx.workers:
        raise InvalidApplication("no workers to place the application on")
    pes = {}
    for i, (pe_id, pe) in enumerate(placement.pes.items()):
        worker = ctx.workers[i % len(ctx.workers)]
        pes[pe_id] = replace(pe, worker=worker, host=ctx.hosts.get(worker, ""))
    placed = replace(placement, pes=MappingProxyType(pes), workers=tuple(ctx.workers),
                     hosts=MappingProxyType(dict(ctx.hosts)), latency_s=ctx.latency_s)
    slotted = with_slots(placed, int(config.get("standard.slots-per-host")))
    logger.info("place %s: %s; %d standard slot(s)", placement.logical.app_name,
                ", ".join(f"{p} on {pe.worker}" for p, pe in slotted.pes.items()), len(slotted.slots))
    return slotted


PHASES: tuple[
    tuple[str, Callable[[Application, CompileContext], LogicalPlan]],
    tuple[str, Callable[[LogicalPlan, CompileContext], LogicalPlan]],
    tuple[str, Callable[[LogicalPlan, CompileContext], Placement]],
    tuple[str, Callable[[Placement, CompileContext], Placement]],
] = (
    ("validate", validate),
    ("annotate", annotate),
    ("fuse", fuse),
    ("place", place),
)


def compile_app(app: Application, plugins: Plugins, workers: list[str] | tuple[str, ...],
                hosts: dict[str, str] | None = None, latency_s: float | None = None) -> Placement:
    """Run the phases in order and place the result on ``workers``; ``latency_s``: the channels'
    latency target (None: ``pescheduler.batch.latency``)."""
    if latency_s is None:
        latency_s = config.get_seconds("batch.latency")
    ctx = CompileContext(plugins, tuple(workers), dict(hosts or {}), latency_s)
    (_, validate_), (_, annotate_), (_, fuse_), (_, place_) = PHASES
    return place_(fuse_(annotate_(validate_(app, ctx), ctx), ctx), ctx)

"""Graph transforms: small functions from one placement to the next.

Each checks first and refuses with :class:`ActionRefused` (the reason is the
message) before it builds anything, so a refused action leaves the running
application untouched. The runtime then applies the difference between the
two placements with one protocol (see reconfigure.py).
"""

from __future__ import annotations

from .actions import ActionRefused, Fuse, Move, Split
from .placement import PE, Placement, pe_name


def _pe(placement: Placement, pe_id: str) -> PE:
    if pe_id not in placement.pes:
        raise ActionRefused(f"unknown PE {pe_id!r}; PEs are: {', '.join(placement.pes)}")
    return placement.pes[pe_id]


def _worker(placement: Placement, worker: str) -> str:
    if worker not in placement.workers:
        raise ActionRefused(f"worker {worker!r} is not in the cluster (gone, or never joined)")
    return worker


def fuse(placement: Placement, action: Fuse) -> Placement:
    """One PE with the operators of both, on ``pe_a``'s worker; adjacency is not required."""
    a, b = _pe(placement, action.pe_a), _pe(placement, action.pe_b)
    if action.pe_a == action.pe_b:
        raise ActionRefused(f"cannot fuse {action.pe_a!r} with itself")
    if a.copy_of or b.copy_of:
        raise ActionRefused("copies are released, not fused")
    operators = a.operators + b.operators
    pes = {k: v for k, v in placement.pes.items() if k not in (action.pe_a, action.pe_b)}
    pes[pe_name(placement.plan, operators)] = PE(_ordered(placement, operators), a.worker, a.host)
    return placement.with_pes(_in_order(placement, pes))


def split(placement: Placement, action: Split) -> Placement:
    """The named operators leave into a new PE on ``worker`` (or the least loaded one)."""
    pe = _pe(placement, action.pe)
    leaving = set(action.operators)
    if not leaving:
        raise ActionRefused("split needs at least one operator")
    unknown = leaving - set(pe.operators)
    if unknown:
        raise ActionRefused(f"{sorted(unknown)} not in PE {action.pe!r} (it runs {list(pe.operators)})")
    if leaving == set(pe.operators):
        raise ActionRefused(f"splitting every operator out of {action.pe!r} is a Move")
    worker = _worker(placement, action.worker) if action.worker else least_loaded(placement)
    staying = tuple(op for op in pe.operators if op not in leaving)
    pes = {k: v for k, v in placement.pes.items() if k != action.pe}
    pes[pe_name(placement.plan, staying)] = PE(staying, pe.worker, pe.host)
    pes[pe_name(placement.plan, tuple(leaving))] = PE(_ordered(placement, leaving), worker,
                                                      placement.hosts.get(worker, ""))
    return placement.with_pes(_in_order(placement, pes))


def move(placement: Placement, action: Move) -> Placement:
    """The same PE on another worker."""
    pe = _pe(placement, action.pe)
    worker = _worker(placement, action.worker)
    if pe.worker == worker:
        raise ActionRefused(f"PE {action.pe!r} already runs on {worker}")
    pes = dict(placement.pes)
    pes[action.pe] = PE(pe.operators, worker, placement.hosts.get(worker, ""), pe.copy_of)
    return placement.with_pes(pes)


def least_loaded(placement: Placement) -> str:
    """The worker running the fewest PEs (the first such in worker order)."""
    if not placement.workers:
        raise ActionRefused("no workers")
    load = {w: 0 for w in placement.workers}
    for pe in placement.pes.values():
        if pe.worker in load:
            load[pe.worker] += 1
    return min(placement.workers, key=lambda w: load[w])


def _ordered(placement: Placement, operators) -> tuple[str, ...]:
    order = {op: i for i, op in enumerate(placement.plan.ops)}
    return tuple(sorted(operators, key=order.__getitem__))


def _in_order(placement: Placement, pes: dict[str, PE]) -> dict[str, PE]:
    """PEs listed in topological order of their first operator (stable, readable status)."""
    order = {op: i for i, op in enumerate(placement.plan.ops)}
    return dict(sorted(pes.items(), key=lambda kv: order[kv[1].operators[0]]))


TRANSFORMS = {Fuse: fuse, Split: split, Move: move}


def transform(placement: Placement, action) -> Placement:
    """The placement after ``action``; refuses actions this module cannot express."""
    try:
        fn = TRANSFORMS[type(action)]
    except KeyError:
        raise ActionRefused(f"{type(action).__name__} is not a placement transform") from None
    return fn(placement, action)

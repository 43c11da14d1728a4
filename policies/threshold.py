"""``threshold``: keep every PE between two utilisation bounds (the IBM method).

IBM's elastic operator fusion (Gedik, Schneider et al.) keeps each PE's load
between a lower and an upper bound of one core:

* A PE above ``upper`` (or whose worker's memory is over ``memory-box``
  bytes) is relieved: a PE of several operators is split where its load
  halves, onto the least loaded worker under ``lower``; a PE of one operator
  has that operator copied onto a free standard slot.
* Two PEs under ``lower`` (and not backpressured, which would understate their
  load) are fused when together they stay under ``upper`` less
  ``fuse-headroom`` (so the fused PE is not split again): neighbours
  (PEs joined by a channel) first, then the least loaded others. The PE on a
  borrowed host is fused into the other, so the borrowed host empties.
* When a split or a copy finds no place, one host is borrowed (if the
  resource manager can lend one); a borrowed host left with no PE and no copy
  is returned.
"""

from __future__ import annotations

from pescheduler.actions import Action, BorrowHosts, Fuse, Replicate, ReturnHost, Split
from pescheduler.plugins import hookimpl

from ._common import View, setting, take_slots


BLOCKED = 0.1       # backpressure above which a PE's busy understates its load


@hookimpl
def pescheduler_policy_decide(snapshot, placement, resources, config):
    """Split/copy over ``upper``, fuse under ``lower``, borrow and return hosts; see the module."""
    return decide(snapshot, placement, resources, config)


def decide(snapshot, placement, resources, config) -> list[Action]:
    upper = float(setting(config, "upper", 0.8))
    lower = float(setting(config, "lower", 0.5))
    headroom = float(setting(config, "fuse-headroom", 0.1))
    box = setting(config, "memory-box", None)
    pes = {p: m for p, m in snapshot.pes.items() if p in placement.pes and not placement.pes[p].copy_of}
    actions: list[Action] = []
    cpu = {w: m.cpu for w, m in snapshot.workers.items() if w in placement.workers}
    homeless = 0
    view = View(snapshot, placement)
    spare = view.free_slots()
    for pe_id, m in pes.items():
        memory = snapshot.workers[m.worker].memory_bytes if m.worker in snapshot.workers else 0
        if m.busy > upper or (box and memory > float(box)):
            action = _relieve(view, pe_id, m, cpu, spare, (lower, upper), memory)
            if action is None:
                homeless += 1
            else:
                actions.append(action)
    actions += _fusions(snapshot, placement, pes, resources, lower, upper - headroom)
    if homeless and resources.lendable > 0 and not resources.pending_returns:
        actions.append(BorrowHosts(1, figures={"pes_without_room": homeless},
                                   reason=f"{homeless} PE(s) over {upper:.0%} and no worker or slot has room"))
    actions += _returns(placement, resources, actions)
    return actions


def _relieve(view, pe_id, m, cpu, spare, bounds, memory) -> Action | None:
    """Split a PE of several operators, copy a PE of one; None when there is no room."""
    lower, upper = bounds
    figures = {"busy": round(m.busy, 3), "upper": upper, "memory_bytes": memory}
    ops = view.placement.pes[pe_id].operators
    if len(ops) > 1:
        leaving = _split_point(view.snapshot, ops)
        slotted = {s.worker for s in view.placement.slots.values()}     # keep slot workers for copies
        room = sorted((c, w in slotted, w) for w, c in cpu.items() if c < lower and w != m.worker)
        if not room:
            return None
        load, _, worker = room[0]
        cpu[worker] = 1.0                       # one split per worker per decision
        return Split(pe_id, leaving, worker, figures={**figures, "target_cpu": round(load, 3)},
                     reason=f"PE {pe_id} is {m.busy:.0%} busy (> {upper:.0%}): {', '.join(leaving)} "
                            f"move to {worker} ({load:.0%} CPU)")
    op = ops[0]
    if not view.replicable(op) or not take_slots(spare, 1, m.worker):
        return None
    return Replicate(op, 1, figures=figures,
                     reason=f"PE {pe_id} is {m.busy:.0%} busy (> {upper:.0%}) with one operator: copy {op}")


def _split_point(snapshot, ops) -> tuple[str, ...]:
    """The tail of the chain that carries about half the PE's load (at least one operator)."""
    busy = [snapshot.operators[o].busy if o in snapshot.operators else 0.0 for o in ops]
    total, acc = sum(busy), 0.0
    for i in range(len(ops) - 1, 0, -1):
        acc += busy[i]
        if acc >= total / 2:
            return tuple(ops[i:])
    return tuple(ops[1:])


def _fusions(snapshot, placement, pes, resources, lower, ceiling) -> list[Action]:
    """Pairs of PEs under ``lower`` whose sum stays under ``ceiling``: neighbours first.

    The others are paired greedily, least loaded first (linear after a sort:
    the policy must decide in milliseconds at 10,000 PEs).
    """
    # a backpressured PE's load is held down by its downstream: fusing on it would be undone
    cold = {p for p, m in pes.items() if m.busy < lower and m.backpressure < BLOCKED and not m.threaded}
    borrowed = set(resources.borrowed)
    where = {op: p for p, pe in placement.pes.items() for op in pe.operators}
    neighbours = list(dict.fromkeys((where[s], d) for s, _p, _o, d in placement.channels()))
    pos = {p: i for i, p in enumerate(placement.pes)}
    others = sorted(cold, key=lambda p: (pes[p].busy, pos[p]))
    taken: set[str] = set()
    actions = []
    for kind, pairs in (("neighbours", neighbours), ("under-loaded", zip(others, others[1:]))):
        for a, b in pairs:
            if a not in cold or b not in cold or a == b or a in taken or b in taken \
                    or pes[a].busy + pes[b].busy >= ceiling:
                continue
            if placement.pes[a].host in borrowed and placement.pes[b].host not in borrowed:
                a, b = b, a                  # keep the PE that is not on a borrowed host where it is
            taken |= {a, b}
            actions.append(Fuse(a, b, figures={"busy_a": round(pes[a].busy, 3), "busy_b": round(pes[b].busy, 3),
                                               "lower": lower},
                                reason=f"{kind} {a} ({pes[a].busy:.0%}) and {b} ({pes[b].busy:.0%}) are under "
                                       f"{lower:.0%}: one PE on {placement.pes[a].worker}"))
    return actions


def _returns(placement, resources, planned) -> list[Action]:
    """Borrowed hosts with no PE (once the planned fusions moved theirs) and no copy in a slot."""
    leaving = {a.pe_b for a in planned if isinstance(a, Fuse)}
    used = {placement.hosts.get(pe.worker, pe.host) for p, pe in placement.pes.items() if p not in leaving}
    used |= {s.host for s in placement.slots.values() if s.copies}
    return [ReturnHost(h, figures={"pes_left": 0}, reason=f"borrowed host {h} runs nothing once fused: return it")
            for h in resources.borrowed if h not in used]

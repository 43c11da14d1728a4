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
* A worker above ``upper`` running several PEs, none of them above it alone,
  has its lightest PE moved to the least loaded worker under ``lower`` (PEs
  sharing one core are each under the bound, yet all are slowed).
* When a split, copy or move finds no place, one host is borrowed (if the
  resource manager can lend one; never for a source or SINGLETON PE, which a
  host would not help); a borrowed host that fusions empty is returned, and
  so is one that has run nothing for ``policies.idle-return-after``.
"""

from __future__ import annotations

import heapq

from pescheduler.actions import Action, BorrowHosts, Fuse, Move, Replicate, Split
from pescheduler.plan.transforms import can_fuse
from pescheduler.plugins import hookimpl

from ._common import View, idle_returns, settings, take_slots


BLOCKED = 0.1       # backpressure above which a PE's busy understates its load
HOPELESS = object()  # _relieve: over the bound, and neither room nor a new host would help


@hookimpl
def pescheduler_policy_decide(snapshot, placement, resources, config) -> list[Action]:
    """Split/copy over ``upper``, fuse under ``lower``, borrow and return hosts; see the module."""
    cfg = settings("threshold", config)     # numbers, and durations in seconds
    upper, lower, headroom, box = cfg["upper"], cfg["lower"], cfg["fuse-headroom"], cfg["memory-box"]
    pes = {p: m for p, m in snapshot.pes.items() if p in placement.pes and not placement.pes[p].copy_of}
    actions: list[Action] = []
    workers = set(placement.workers)
    cpu = {w: m.cpu for w, m in snapshot.workers.items() if w in workers}
    homeless = 0
    view = View.of(snapshot, placement)
    spare = view.free_slots()
    room = Room(cpu, lower, {s.worker for s in placement.slots.values()})
    for pe_id, m in pes.items():
        memory = snapshot.workers[m.worker].memory_bytes if m.worker in snapshot.workers else 0
        if m.busy > upper or (box and memory > float(box)):
            action = _relieve(view, pe_id, m, room, spare, upper, memory)
            if action is None:
                homeless += 1
            elif action is not HOPELESS:
                actions.append(action)
    moves, crowded = _crowded(pes, cpu, room, {a.target for a in actions}, upper, upper - headroom)
    actions += moves
    homeless += crowded
    acted = {a.target for a in actions}     # one action per PE per decision
    actions += _fusions(view, {p: m for p, m in pes.items() if p not in acted}, cpu, resources, lower,
                        upper - headroom)
    if homeless and resources.lendable > 0 and not resources.pending_returns:
        actions.append(BorrowHosts(1, figures={"pes_without_room": homeless},
                                   reason=f"{homeless} PE(s) over {upper:.0%} and no worker or slot has room"))
    actions += idle_returns(placement, resources, actions)
    return actions


class Room:
    """Workers under ``lower`` CPU, least loaded first (on a tie, those without a standard slot,
    kept for copies): where split-off and moved PEs go, each worker taken once per decision."""

    def __init__(self, cpu: dict, lower: float, slotted: set) -> None:
        self.heap = [(c, w in slotted, w) for w, c in cpu.items() if c < lower]
        heapq.heapify(self.heap)

    def take(self, avoid: str) -> tuple[float, str] | None:
        """The least loaded worker other than ``avoid``, removed from the room; None if none."""
        skipped, found = [], None
        while self.heap and found is None:
            item = heapq.heappop(self.heap)
            if item[2] == avoid:
                skipped.append(item)
            else:
                found = (item[0], item[2])
        for item in skipped:
            heapq.heappush(self.heap, item)
        return found


def _relieve(view, pe_id, m, room: Room, spare, upper, memory) -> Action | None:
    """Split a PE of several operators, copy a PE of one; None when there is no room (a host
    would help), :data:`HOPELESS` when nothing would."""
    figures = {"busy": round(m.busy, 3), "upper": upper, "memory_bytes": memory}
    ops = view.placement.pes[pe_id].operators
    if len(ops) > 1:
        leaving = _split_point(view.snapshot, ops)
        found = room.take(m.worker)
        if found is None:
            return None
        load, worker = found
        return Split(pe_id, leaving, worker, figures={**figures, "target_cpu": round(load, 3)},
                     reason=f"PE {pe_id} is {m.busy:.0%} busy (> {upper:.0%}): {', '.join(leaving)} "
                            f"move to {worker} ({load:.0%} CPU)")
    op = ops[0]
    if not view.replicable(op):
        return HOPELESS                        # a source or SINGLETON alone in its PE: no host helps
    if not take_slots(spare, 1, m.worker):
        return None
    return Replicate(op, 1, figures=figures,
                     reason=f"PE {pe_id} is {m.busy:.0%} busy (> {upper:.0%}) with one operator: copy {op}")


def _crowded(pes, cpu, room: Room, relieved: set, upper: float, ceiling: float) -> tuple[list[Action], int]:
    """Workers over ``upper`` running several PEs, none over it alone: the lightest PE moves to the
    least loaded worker under ``lower``, if that one stays under ``ceiling`` with it. Returns the
    moves and how many workers found no room."""
    on: dict[str, list[str]] = {}
    for p, m in pes.items():
        on.setdefault(m.worker, []).append(p)
    moves, stuck = [], 0
    for worker, here in on.items():
        if cpu.get(worker, 0.0) <= upper or len(here) < 2 or relieved & set(here):
            continue
        light = min(here, key=lambda p: (pes[p].busy, p))
        found = room.take(worker)
        if found is None or found[0] + pes[light].busy >= ceiling:
            stuck += 1
            continue
        load, dest = found
        cpu[dest] = load + pes[light].busy
        moves.append(Move(light, dest, figures={"worker_cpu": round(cpu[worker], 3), "pes_on_worker": len(here),
                                                "busy": round(pes[light].busy, 3), "target_cpu": round(load, 3)},
                          reason=f"worker {worker} is {cpu[worker]:.0%} busy running {len(here)} PEs: "
                                 f"{light} ({pes[light].busy:.0%}) moves to {dest} ({load:.0%} CPU)"))
    return moves, stuck


def _split_point(snapshot, ops) -> tuple[str, ...]:
    """The tail of the chain that carries about half the PE's load (at least one operator)."""
    busy = [snapshot.operators[o].busy if o in snapshot.operators else 0.0 for o in ops]
    total, acc = sum(busy), 0.0
    for i in range(len(ops) - 1, 0, -1):
        acc += busy[i]
        if acc >= total / 2:
            return tuple(ops[i:])
    return tuple(ops[1:])


def _fusions(view, pes, cpu, resources, lower, ceiling) -> list[Action]:
    """Pairs of PEs under ``lower`` whose sum, and the worker they end up on, stay under
    ``ceiling``: neighbours first.

    The others are paired greedily, least loaded first (linear after a sort:
    the policy must decide in milliseconds at 10,000 PEs).
    """
    # a backpressured PE's load is held down by its downstream: fusing on it would be undone
    cold = {p for p, m in pes.items() if m.busy < lower and m.backpressure < BLOCKED and not m.threaded}
    placement, where = view.placement, view.pe_of
    borrowed = set(resources.borrowed)
    neighbours = dict.fromkeys((where[s], where[d]) for s, _p, d in placement.plan.edges)
    others = [p for _b, _i, p in sorted((pes[p].busy, i, p) for i, p in enumerate(placement.pes) if p in cold)]
    taken: set[str] = set()
    actions = []
    for kind, pairs in (("neighbours", neighbours), ("under-loaded", zip(others, others[1:]))):
        for a, b in pairs:
            if a not in cold or b not in cold or a == b or a in taken or b in taken \
                    or pes[a].busy + pes[b].busy >= ceiling:
                continue
            if placement.pes[a].host in borrowed and placement.pes[b].host not in borrowed:
                a, b = b, a                  # keep the PE that is not on a borrowed host where it is
            if can_fuse(placement, a, b) is not None:
                continue                     # the transform would refuse it (e.g. a copied operator)
            wa, wb = pes[a].worker, pes[b].worker
            after = cpu.get(wa, pes[a].busy) + (pes[b].busy if wb != wa else 0.0)
            if after >= ceiling:             # b joins a's worker: it must not crowd it
                continue
            cpu[wa], cpu[wb] = after, cpu.get(wb, 0.0) - (pes[b].busy if wb != wa else 0.0)
            taken |= {a, b}
            actions.append(Fuse(a, b, figures={"busy_a": round(pes[a].busy, 3), "busy_b": round(pes[b].busy, 3),
                                               "lower": lower},
                                reason=f"{kind} {a} ({pes[a].busy:.0%}) and {b} ({pes[b].busy:.0%}) are under "
                                       f"{lower:.0%}: one PE on {placement.pes[a].worker}"))
    return actions

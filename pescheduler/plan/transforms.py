"""Graph transforms: small functions from one physical plan (placement) to the next.

Each checks first and refuses with :class:`ActionRefused` (the reason is the
message) before it builds anything, so a refused action leaves the running
application untouched. The runtime then applies the difference between the
two placements with one protocol (see control/protocol.py).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from ..actions import ActionRefused, Fuse, Move, Release, Replicate, Split
from ..operator import Operator, Parallelism
from .placement import PE, Placement, Slot, pe_name
from .routing import Route, even_key_groups


class NoSlotLeft(ActionRefused):
    """Every standard slot away from the hot operator's worker is taken (a cold start may help)."""


def _pe(placement: Placement, pe_id: str) -> PE:
    if pe_id not in placement.pes:
        raise ActionRefused(f"unknown PE {pe_id!r}; PEs are: {', '.join(placement.pes)}")
    return placement.pes[pe_id]


def _worker(placement: Placement, worker: str) -> str:
    if worker not in placement.workers:
        raise ActionRefused(f"worker {worker!r} is not in the cluster (gone, or never joined)")
    return worker


def can_fuse(placement: Placement, a: str, b: str) -> str | None:
    """Why PEs ``a`` and ``b`` cannot become one PE, or None if they can.

    The one fusion rule (as Ray Data's operator fusion), used by the
    compiler's fuse phase, the fuse transform and the ``threshold`` policy.
    Adjacency is not required: fused non-adjacent operators are wired like
    any others. Guards, cheapest first; the first that fails is the reason:
    """
    # 1. both PEs exist in this plan (a policy may name one a previous action removed)
    for pe_id in (a, b):
        if pe_id not in placement.pes:
            return f"unknown PE {pe_id!r}; PEs are: {', '.join(placement.pes)}"
    # 2. two different PEs
    if a == b:
        return f"cannot fuse {a!r} with itself"
    # 3. no copy: a copy lives on a standard slot and goes away by Release
    if placement.pes[a].copy_of or placement.pes[b].copy_of:
        return "copies are released, not fused"
    # 4. an operator with copies keeps an input channel of its own: its routers send it a
    #    share of their batches, which a channel also feeding another operator could not carry
    inside = set(placement.pes[a].operators) | set(placement.pes[b].operators)
    for op_id in placement.routes:
        shared = _shared_inputs_in(placement, op_id, inside) if op_id in inside else []
        if shared:
            return (f"{op_id!r} has copies and would share its input channel with "
                    f"{shared}; release its copies first")
    return None


def fuse(placement: Placement, action: Fuse) -> Placement:
    """One PE with the operators of both, on ``pe_a``'s worker (see :func:`can_fuse`)."""
    reason = can_fuse(placement, action.pe_a, action.pe_b)
    if reason is not None:
        raise ActionRefused(reason)
    return fused(placement, action.pe_a, action.pe_b)


def fused(placement: Placement, pe_a: str, pe_b: str) -> Placement:
    """The plan with PEs ``pe_a`` and ``pe_b`` made one, on ``pe_a``'s worker; unchecked
    (callers ask :func:`can_fuse` first)."""
    a, b = placement.pes[pe_a], placement.pes[pe_b]
    operators = a.operators + b.operators
    pes = {k: v for k, v in placement.pes.items() if k not in (pe_a, pe_b)}
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
    return _routable(placement.with_pes(_in_order(placement, pes)))


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


# -- copies on standard slots --------------------------------------------------------

def replicate(placement: Placement, action: Replicate) -> Placement:
    """``copies`` copies of an operator on standard slots, and the routers' new distribution lists.

    Copies go to the operator's candidate slots (see :func:`candidate_slots`)
    that are not on its own worker (a copy in the same process adds no core),
    free ones first. KEYED copies take an even share of the key groups.
    """
    op_id = action.operator
    op = _replicable(placement, op_id)
    if action.copies < 1:
        raise ActionRefused(f"copies must be >= 1 (got {action.copies})")
    keyed = op.parallelism is Parallelism.KEYED
    routers = routers_of(placement, op_id)
    if action.routers is not None:
        if keyed:
            raise ActionRefused(f"{op_id!r} is KEYED: its copies are shared by every router "
                                f"(all must agree on who owns a key group)")
        unknown = sorted(set(action.routers) - set(routers))
        if unknown or not action.routers:
            raise ActionRefused(f"{unknown or '()'} do not feed {op_id!r}; its routers are {routers}")
    home = placement.pes[placement.pe_of(op_id)]
    slots = pick_slots(placement, op_id, action.copies, avoid=home.worker, hosts=action.hosts)
    taken = set(placement.plan.ops)
    made, n = [], 1
    for _ in slots:
        while f"{op_id}#{n}" in taken:
            n += 1
        made.append(f"{op_id}#{n}")
        taken.add(made[-1])
    route = placement.routes.get(op_id, Route())
    users = dict(route.users)
    for c in made:
        users[c] = tuple(action.routers) if action.routers is not None else tuple(routers)
    instances = placement.instances(op_id) + made
    new_route = Route(MappingProxyType(users),
                      MappingProxyType(even_key_groups(instances)) if keyed else None)
    pes = dict(placement.pes)
    new_slots = dict(placement.slots)
    for c, slot_id in zip(made, slots):
        slot = new_slots[slot_id]
        pes[c] = PE((c,), slot.worker, slot.host, copy_of=op_id)
        new_slots[slot_id] = replace(slot, copies=slot.copies + (c,))
    routes = _inherit_routes(placement, op_id, made)
    routes[op_id] = new_route
    copied = replace(placement, copies=MappingProxyType({**placement.copies, **{c: op_id for c in made}}),
                     slots=MappingProxyType(new_slots), routes=MappingProxyType(routes))
    return copied.with_pes(_in_order(copied, pes))


def release(placement: Placement, action: Release) -> Placement:
    """Drop the newest ``copies`` copies (or only some routers' use of them: reference counting)."""
    op_id = action.operator
    if op_id not in placement.plan.ops:
        raise ActionRefused(f"unknown operator {op_id!r}")
    have = placement.copies_of(op_id)
    if action.copies < 1:
        raise ActionRefused(f"copies must be >= 1 (got {action.copies})")
    route = placement.routes.get(op_id, Route())
    users = dict(route.users)
    if action.routers is None:
        if action.copies > len(have):
            raise ActionRefused(f"{op_id!r} has {len(have)} copies, cannot release {action.copies}")
        gone = have[len(have) - action.copies:]
    else:
        mine = [c for c in have if set(action.routers) & set(users.get(c, ()))]
        if not mine:
            raise ActionRefused(f"no copy of {op_id!r} is used by {list(action.routers)}")
        gone = []
        for c in mine[len(mine) - action.copies:]:
            users[c] = tuple(r for r in users[c] if r not in action.routers)
            if not users[c]:
                gone.append(c)
    for c in gone:
        users.pop(c, None)
    return _without_copies(placement, op_id, gone, users)


def _without_copies(placement: Placement, op_id: str, gone: list[str], users: dict) -> Placement:
    """The placement with copies ``gone`` removed (their PEs, slots, and every route naming them)."""
    copy_map = {c: o for c, o in placement.copies.items() if c not in gone}
    keyed = placement.plan.ops[op_id].parallelism is Parallelism.KEYED
    remaining = [op_id] + [c for c, o in copy_map.items() if o == op_id]
    routes = {}
    for target, route in placement.routes.items():
        kept = {c: tuple(r for r in u if r not in gone) for c, u in route.users.items()}
        routes[target] = Route(MappingProxyType(kept), route.key_groups)
    routes[op_id] = Route(MappingProxyType(users),
                          MappingProxyType(even_key_groups(remaining)) if keyed else None)
    if len(remaining) == 1:
        del routes[op_id]
    pes = {p: pe for p, pe in placement.pes.items() if p not in gone}
    slots = {s: replace(slot, copies=tuple(c for c in slot.copies if c not in gone))
             for s, slot in placement.slots.items()}
    return replace(placement, copies=MappingProxyType(copy_map), pes=MappingProxyType(pes),
                   slots=MappingProxyType(slots), routes=MappingProxyType(routes))


def _replicable(placement: Placement, op_id: str):
    """The operator, if copies of it make sense; refuses with the reason otherwise."""
    op = placement.plan.ops.get(op_id)
    if op is None:
        raise ActionRefused(f"unknown operator {op_id!r}")
    if op_id in placement.copies:
        raise ActionRefused(f"{op_id!r} is a copy of {placement.copies[op_id]!r}: replicate the original")
    if op.parallelism is Parallelism.SINGLETON:
        raise ActionRefused(f"{op_id!r} is SINGLETON ({op.kind} {op.name!r}): it is never copied")
    if op.parallelism is Parallelism.KEYED:
        if op.key_field is None:
            raise ActionRefused(f"{op_id!r} is KEYED but has no key (no key_by before it): "
                                f"its copies could not share the key space")
        if not _implements(op.cls, "split_state", "merge_states"):
            raise ActionRefused(f"{op_id!r} ({op.cls.__name__}) is KEYED but does not implement "
                                f"split_state/merge_states, so its state cannot move between copies")
    if op.parallelism is Parallelism.MERGEABLE and not (
            _implements(op.cls, "take_partials") and
            (_implements(op.cls, "absorb") or _implements(op.cls, "combine"))):
        raise ActionRefused(f"{op_id!r} ({op.cls.__name__}) is MERGEABLE but does not implement "
                            f"take_partials and absorb (or combine)")
    shared = _shared_inputs(placement, op_id)
    if shared:
        raise ActionRefused(f"{op_id!r} shares its input channel with {shared} in PE "
                            f"{placement.pe_of(op_id)!r}: split it out of that PE first")
    return op


def _routable(placement: Placement) -> Placement:
    """Refuse a placement where an operator with copies shares its input channel with another
    consumer (its router could not send that operator alone a share)."""
    for op_id in placement.routes:
        shared = _shared_inputs(placement, op_id)
        if shared:
            raise ActionRefused(f"{op_id!r} has copies and would share its input channel with "
                                f"{shared}; release its copies first")
    return placement


def _implements(cls: type, *methods: str) -> bool:
    return all(getattr(cls, m) is not getattr(Operator, m) for m in methods)


def _shared_inputs(placement: Placement, op_id: str) -> list[str]:
    """Other operators in ``op_id``'s PE fed by the same remote port: one channel serves both,
    so a router could not send part of it to ``op_id`` alone."""
    return _shared_inputs_in(placement, op_id, set(placement.pes[placement.pe_of(op_id)].operators))


def _shared_inputs_in(placement: Placement, op_id: str, inside: set[str]) -> list[str]:
    """:func:`_shared_inputs` for ``op_id`` in a PE of the operators ``inside``."""
    mine = {(s, p) for s, p, d in placement.plan.edges if d == op_id and s not in inside}
    return sorted({d for s, p, d in placement.plan.edges
                   if (s, p) in mine and d != op_id and d in inside})


def routers_of(placement: Placement, op_id: str) -> list[str]:
    """The upstream instances that feed ``op_id`` (its copies' partials excluded)."""
    return list(dict.fromkeys(s for s, _p, d in placement.plan.edges
                              if d == op_id and placement.copies.get(s) != op_id))


def candidate_slots(placement: Placement, op_id: str) -> list[str]:
    """``op_id``'s distribution list: every slot, rotated per operator.

    The first replicable operator's list starts at the first slot, the
    second's a third of the way in, and so on, so a slot tends to hold one
    operator's parameters (Fujitsu's destination lists).
    """
    slots = list(placement.slots)
    if not slots:
        return []
    replicable = [o for o, op in placement.logical.ops.items() if op.parallelism is not Parallelism.SINGLETON]
    k = replicable.index(op_id) if op_id in replicable else 0
    offset = (k * max(1, len(slots) // 3)) % len(slots)
    return slots[offset:] + slots[:offset]


def pick_slots(placement: Placement, op_id: str, n: int, avoid: str,
               hosts: tuple[str, ...] | None = None) -> list[str]:
    """``n`` slots from ``op_id``'s candidate list, off worker ``avoid`` (and on ``hosts`` when
    given): free ones first, then shared ones least used; refuses with :class:`NoSlotLeft`
    when there are not enough."""
    candidates = [s for s in candidate_slots(placement, op_id) if placement.slots[s].worker != avoid
                  and (hosts is None or placement.slots[s].host in hosts)]
    mine = {s for s in candidates if any(placement.copies.get(c) == op_id for c in placement.slots[s].copies)}
    usable = [s for s in candidates if s not in mine]
    usable.sort(key=lambda s: len(placement.slots[s].copies))       # stable: list order breaks ties
    usable = _spread(placement, op_id, usable)
    if len(usable) < n:
        where = f" on hosts {', '.join(hosts)}" if hosts is not None else ""
        raise NoSlotLeft(f"{op_id!r} needs {n} standard slot(s) off {avoid}{where}; {len(usable)} usable "
                         f"of {len(placement.slots)} (slots holding a copy of it already, or on its "
                         f"own worker, do not count)")
    return usable[:n]


def _spread(placement: Placement, op_id: str, slots: list[str]) -> list[str]:
    """``slots`` with those on a worker no instance of ``op_id`` runs on first, one per worker,
    then the rest, each part in the given order: a second instance in one worker process shares
    its GIL and its host's CPU (a lab host of half a core runs one worker with two slots), so it
    adds no core while a slot elsewhere does (issue 15)."""
    used = {placement.pes[placement.pe_of(i)].worker for i in placement.instances(op_id)}
    first = []
    for s in slots:
        if placement.slots[s].worker not in used:
            used.add(placement.slots[s].worker)
            first.append(s)
    return first + [s for s in slots if s not in first]


def with_slots(placement: Placement, per_host: int) -> Placement:
    """Standard slots for every host of the placement: ``per_host`` each, spread over its workers.

    Existing slots on workers still present are kept (with their copies);
    slots on workers that left are dropped. New slots are numbered after the
    highest existing one, so ids are never reused.
    """
    slots = {s: slot for s, slot in placement.slots.items() if slot.worker in placement.workers}
    by_host: dict[str, list[str]] = {}
    for w in placement.workers:
        by_host.setdefault(placement.hosts.get(w, ""), []).append(w)
    have: dict[str, int] = {}
    for slot in slots.values():
        have[slot.host] = have.get(slot.host, 0) + 1
    n = max((int(s.rsplit("-", 1)[1]) for s in placement.slots), default=0)
    for host, workers in by_host.items():
        for i in range(have.get(host, 0), per_host):
            n += 1
            slots[f"slot-{n}"] = Slot(workers[i % len(workers)], host)
    return replace(placement, slots=MappingProxyType(slots))


def _inherit_routes(placement: Placement, op_id: str, made: list[str]) -> dict[str, Route]:
    """New copies of ``op_id`` route downstream like ``op_id``: they join every copy it uses."""
    routes = dict(placement.routes)
    for target, route in placement.routes.items():
        users = {c: u + tuple(made) if op_id in u else u for c, u in route.users.items()}
        routes[target] = Route(MappingProxyType(users), route.key_groups)
    return routes


TRANSFORMS = {Fuse: fuse, Split: split, Move: move, Replicate: replicate, Release: release}


def transform(placement: Placement, action) -> Placement:
    """The placement after ``action``; refuses actions this module cannot express."""
    try:
        fn = TRANSFORMS[type(action)]
    except KeyError:
        raise ActionRefused(f"{type(action).__name__} is not a placement transform") from None
    return fn(placement, action)


# -- the worker set (the Reconfigurer applies these; H1) -------------------------------------------

def add_workers(placement: Placement, hosts: dict[str, str]) -> Placement:
    """``hosts`` (``worker -> host``) join the placement; workers already in it are kept as they are."""
    new = tuple(w for w in hosts if w not in placement.workers)
    return replace(placement, workers=placement.workers + new,
                   hosts=MappingProxyType({**placement.hosts, **{w: hosts[w] for w in new}}))


def remove_workers(placement: Placement, workers: set[str]) -> Placement:
    """``workers`` leave: nothing new is placed there, their slots go (their PEs move separately)."""
    return replace(placement, workers=tuple(w for w in placement.workers if w not in workers),
                   hosts=MappingProxyType({w: h for w, h in placement.hosts.items() if w not in workers}),
                   slots=MappingProxyType({k: s for k, s in placement.slots.items() if s.worker not in workers}))


def add_slot(placement: Placement, worker: str) -> Placement:
    """One more standard slot on ``worker`` (of the placement), numbered after the highest id."""
    n = max((int(s.rsplit("-", 1)[1]) for s in placement.slots), default=0) + 1
    slot = Slot(worker, placement.hosts.get(worker, ""))
    return replace(placement, slots=MappingProxyType({**placement.slots, f"slot-{n}": slot}))

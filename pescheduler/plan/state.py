"""Operator state across a change of placement: which PEs must hand theirs over, and how it is dealt.

Pure: from the placement before and after and the snapshots of the retired
instances to the snapshots the new instances restore. A reconfiguration
(``control/protocol.py``) and a restore from a checkpoint onto another
placement (``checkpoint/restore.py``) deal state by ``redistribute``.

A reconfiguration moves a KEYED operator's key groups instance to instance
instead (``group_moves``): the instances that keep their PE keep running, and
only the groups that change owner travel, worker to worker
(``worker/handover.py``), never through the deploying process.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..operator import Operator, Parallelism, Share
from ..wire import KEY_GROUPS, key_group, least_progress
from .placement import Placement


@dataclass(frozen=True)
class GroupMove:
    """Key groups of KEYED operator ``op`` that change owner: instance ``src`` (in PE ``src_pe``
    on ``src_worker``) exports them, instance ``dst`` (PE ``dst_pe`` on ``dst_worker``) takes
    them. ``src_live``/``dst_live``: that PE stays running through the reconfiguration. The
    groups' state arrives after the routing switch: the gaining instance holds their tuples until
    it does (``worker/pending_groups.py``), so the pause never waits for it."""

    op: str
    src: str
    src_pe: str
    src_worker: str
    src_live: bool
    dst: str
    dst_pe: str
    dst_worker: str
    dst_live: bool
    groups: tuple[int, ...]


def group_moves(old: Placement, new: Placement) -> dict[str, list[GroupMove]]:
    """KEYED operator -> the key-group moves a reconfiguration makes of it, for every operator
    whose groups can move while the instances that keep their PE run on.

    Where an instance that stays gives groups away, every operator routing to the
    operator's instances must run in that instance's PE: the routing switch and the
    export then happen in one turn of that PE, so nothing of a moved group is processed
    there after it, and nothing before it elsewhere; and the groups must go to a new instance,
    which starts once they are in (one that stays could take a routed tuple first). Any other
    layout (a copy that stays and gives groups away) is left to ``keyed_rebalanced``: all
    instances replaced.
    """
    out: dict[str, list[GroupMove]] = {}
    for x, op in new.plan.ops.items():
        if (op.copy_of or op.parallelism is not Parallelism.KEYED or op.kind == "source" or _hands_over(op)
                or x not in old.plan.ops):
            continue
        moves = _moves_of(old, new, x)
        if moves is not None and moves:
            out[x] = moves
    return out


def _moves_of(old: Placement, new: Placement, x: str) -> list[GroupMove] | None:
    """``x``'s group moves, or None when one that stays gives groups away outside its routers' PE."""
    before, after = _owners(old, x), _owners(new, x)
    by_pair: dict[tuple[str, str], list[int]] = {}
    for g, (src, dst) in enumerate(zip(before, after)):
        if src != dst or not _stays(old, new, src):
            by_pair.setdefault((src, dst), []).append(g)
    routers = {old.pe_of(s) for s, _p, d in old.plan.edges if old.original(d) == x}
    routers |= {new.pe_of(s) for s, _p, d in new.plan.edges if new.original(d) == x}
    moves = []
    for (src, dst), groups in by_pair.items():
        src_live, dst_live = _stays(old, new, src), _stays(old, new, dst)
        if src_live and (dst_live or routers != {old.pe_of(src)}):
            return None
        moves.append(GroupMove(x, src, old.pe_of(src), old.pes[old.pe_of(src)].worker, src_live,
                               dst, new.pe_of(dst), new.pes[new.pe_of(dst)].worker, dst_live,
                               tuple(groups)))
    return moves


#: the hooks of an operator whose result depends on event time's progress (:func:`carries`)
EVENT_TIME_HOOKS = ("on_watermark", "held_watermark")


def carries(op) -> bool:
    """May an instance of ``op`` that gives its key groups to gating owners hand its queued input
    over with them instead of processing it (``worker/carried_input.py``)? Where its tuples come
    through ``process`` (a carried tuple has no input to go with), and its result does not depend
    on event time's progress: an operator that fires
    on watermarks or holds its output's back judges a tuple against its own watermark, and the
    gaining instance's can be past the giving one's (both got the same watermarks, the giver was
    behind): a tuple on time at the giver could be late there."""
    return (getattr(op.cls, "process_input") is getattr(Operator, "process_input")
            and all(getattr(op.cls, h) is getattr(Operator, h) for h in EVENT_TIME_HOOKS))


def _owners(placement: Placement, x: str) -> list[str]:
    """Key group -> the instance of ``x`` that owns it."""
    return placement.routes[x].owners() if x in placement.routes else [x] * KEY_GROUPS


def _stays(old: Placement, new: Placement, inst: str) -> bool:
    """``inst`` keeps running in its PE: same PE id, operators and worker before and after."""
    if inst not in old.plan.ops or inst not in new.plan.ops or old.pe_of(inst) != new.pe_of(inst):
        return False
    before, after = old.pes[old.pe_of(inst)], new.pes[new.pe_of(inst)]
    return (before.operators, before.worker) == (after.operators, after.worker)


def keyed_rebalanced(old: Placement, new: Placement, moving: frozenset[str] = frozenset()) -> set[str]:
    """PEs running an instance of a KEYED operator whose key groups change owner: they are
    replaced, so all of that operator's state is snapshotted and re-split (``moving``:
    operators whose groups move by ``group_moves`` instead)."""
    pes = set()
    for x, op in new.plan.ops.items():
        if op.copy_of or x in moving:
            continue
        if _hands_over(op) and set(old.instances(x)) - set(new.instances(x)):
            pes.add(old.pe_of(x))               # the original takes over what released copies staged
        if not _shares_state(op):
            continue
        if old.instances(x) != new.instances(x) or old.routes.get(x) != new.routes.get(x):
            pes |= {old.pe_of(i) for i in old.instances(x)}
    return pes


def redistribute(old: Placement, new: Placement, states: dict[str, dict],
                 moving: frozenset[str] = frozenset()) -> dict[str, dict]:
    """Snapshots for the new PEs: keyed state re-split when a KEYED operator's instances change.

    Every instance of such an operator was retired (``force``), so ``states``
    holds all of its keys: they are merged and each new instance restores
    the key groups it owns. Progress (watermarks) is the least advanced of
    the old instances', so no instance fires a window another had not.
    ``moving``: operators whose key groups moved worker to worker (``group_moves``):
    their instances' snapshots here are left out.
    """
    out = dict(states)
    for x, op in new.plan.ops.items():
        if x in moving:
            for inst in set(old.instances(x)) | set(new.instances(x)):
                out.pop(inst, None)
            continue
        if op.copy_of:
            continue
        if _hands_over(op):
            _hand_over(op, old.instances(x), new.instances(x), out)
        if not _shares_state(op):
            continue
        before, after = old.instances(x), new.instances(x)
        if before == after and old.routes.get(x) == new.routes.get(x):
            continue
        saved = [states[i] for i in before if i in states]
        if not saved:
            continue
        impl = op.cls(**op.params)
        merged = impl.merge_states([s["state"] for s in saved])
        progress = least_progress([s["progress"] for s in saved])
        if op.kind == "source":
            for inst in before:
                out.pop(inst, None)
            out.update(_partitions_over(impl, merged, progress, after, states))
            continue
        owners = new.routes[x].owners() if x in new.routes else [x] * KEY_GROUPS
        for inst in before:
            out.pop(inst, None)
        for inst in after:
            mine = frozenset(g for g, o in enumerate(owners) if o == inst)
            part = impl.split_state(merged, lambda k, mine=mine: key_group(k) in mine)
            out[inst] = {"state": part, "progress": progress, "driver": None}
    return out


def _shares_state(op) -> bool:
    """Instances of ``op`` divide its work by state that moves when copies come or go: a KEYED
    operator's key groups, a partitioned source's partitions."""
    return op.parallelism is Parallelism.KEYED or bool(getattr(op.cls, "partitioned", False))


def _hands_over(op) -> bool:
    """A sink whose instances stage output until a checkpoint commits it (merge_states): what an
    instance that goes away staged is handed to the original, or it would never be published."""
    return op.kind == "sink" and getattr(op.cls, "merge_states") is not getattr(Operator, "merge_states")


def _hand_over(op, before: list[str], after: list[str], states: dict[str, dict]) -> None:
    """The states of ``op``'s instances not in ``after`` merged into the original's (in place):
    a released copy, or a copy a restore onto fewer instances leaves out."""
    gone = [i for i in before if i not in after and i in states]
    if not gone or op.op_id not in states:
        return
    impl = op.cls(**op.params)
    mine = states[op.op_id]
    states[op.op_id] = {**mine, "state": impl.merge_states([mine["state"]] + [states.pop(i)["state"] for i in gone])}


def _partitions_over(impl, merged, progress, after, states) -> dict[str, dict]:
    """A partitioned source's positions dealt over its new instances (``Share(i, n)``); an
    instance that existed keeps its own pacing and watermark progress (its driver)."""
    return {inst: {"state": impl.split_state(merged, Share(i, len(after))), "progress": progress,
                   "driver": states[inst]["driver"] if inst in states else None}
            for i, inst in enumerate(after)}

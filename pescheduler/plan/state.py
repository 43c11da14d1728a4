"""Operator state across a change of placement: which PEs must hand theirs over, and how it is dealt.

Pure: from the placement before and after and the snapshots of the retired
instances to the snapshots the new instances restore. A reconfiguration
(``control/protocol.py``) and a restore from a checkpoint onto another
placement (``checkpoint/restore.py``) deal state by this one function.
"""

from __future__ import annotations

from ..operator import Operator, Parallelism, Share
from ..wire import KEY_GROUPS, key_group
from .placement import Placement


def keyed_rebalanced(old: Placement, new: Placement) -> set[str]:
    """PEs running an instance of a KEYED operator whose key groups change owner: they are
    replaced, so all of that operator's state is snapshotted and re-split."""
    pes = set()
    for x, op in new.plan.ops.items():
        if op.copy_of:
            continue
        if _hands_over(op) and set(old.instances(x)) - set(new.instances(x)):
            pes.add(old.pe_of(x))               # the original takes over what released copies staged
        if not _shares_state(op):
            continue
        if old.instances(x) != new.instances(x) or old.routes.get(x) != new.routes.get(x):
            pes |= {old.pe_of(i) for i in old.instances(x)}
    return pes


def redistribute(old: Placement, new: Placement, states: dict[str, dict]) -> dict[str, dict]:
    """Snapshots for the new PEs: keyed state re-split when a KEYED operator's instances change.

    Every instance of such an operator was retired (``force``), so ``states``
    holds all of its keys: they are merged and each new instance restores
    the key groups it owns. Progress (watermarks) is the least advanced of
    the old instances', so no instance fires a window another had not.
    """
    out = dict(states)
    for x, op in new.plan.ops.items():
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
        progress = _least_progress([s["progress"] for s in saved])
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


def _least_progress(progresses: list[tuple]) -> tuple:
    """Chain progress ``(in_wm, wm, open_inputs, ended)`` no further than any of ``progresses``."""
    in_wm: dict[str, int] = {}
    for p in progresses:
        for u, w in p[0].items():
            in_wm[u] = min(w, in_wm.get(u, w))
    return (in_wm, min(p[1] for p in progresses), set().union(*(p[2] for p in progresses)),
            all(p[3] for p in progresses))

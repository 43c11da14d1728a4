"""Key groups of a KEYED operator handed from one instance to another, worker to worker.

A Replicate, Release or Move of a KEYED operator (``control/protocol.py``, the
moves from ``plan/state.py``'s ``group_moves``) moves only the key groups that
change owner, and never through the deploying process:

* the losing instance exports them between two of its PE's turns (an
  instance that stays: in the very turn its PE's routers switch, so it
  processes nothing of them after; an instance going away: once aligned on
  the reconfiguration's marker) together with its watermark progress, and
  this worker sends the bytes straight to the gaining instance's worker over
  Dask's comm between workers (``pe_handover_put``);
* an instance that stays imports them between its turns, before any tuple of
  those groups is routed to it (the protocol rewires the routers after);
* a new instance is deployed from them: its spec names what it waits for
  (``{"handover": tag, "parts": n, "timeout": s}`` in ``PESpec.restore``) and
  the PE host builds it once they are all here (:meth:`HandOvers.resolve`),
  while the tuples already routed to it wait in their channel.

An operator exports and imports groups with its own ``export_groups(groups)`` /
``import_groups(state)`` where it has them (the state of the groups, in its
snapshot's form, removed from / added to the running instance: cost of the
moving groups only); any other KEYED operator through ``snapshot``,
``split_state``, ``merge_states`` and ``restore`` (cost of its whole state,
on the worker).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import cloudpickle

from ..operator import Operator
from ..wire import PESpec, key_group, least_progress


def export_groups(op: Operator, groups) -> Any:
    """The state of key groups ``groups`` of running instance ``op``, removed from it."""
    mine = frozenset(groups)
    hook = getattr(op, "export_groups", None)
    if hook is not None:
        return hook(mine)
    saved = op.snapshot()
    op.restore(op.split_state(saved, lambda key: key_group(key) not in mine))
    return op.split_state(saved, lambda key: key_group(key) in mine)


def import_groups(op: Operator, state: Any) -> None:
    """Add exported key groups (disjoint from ``op``'s own) to running instance ``op``."""
    hook = getattr(op, "import_groups", None)
    if hook is not None:
        hook(state)
        return
    op.restore(op.merge_states([op.snapshot(), state]))


def exported(pe: Any, move: dict) -> dict:
    """One move's groups out of its instance in ``pe`` (call it between the PE's turns), with the
    instance's watermark progress, which the gaining instance starts from."""
    return {"state": export_groups(pe.ops[move["src"]], move["groups"]),
            "progress": pe.chain.progress()[move["src"]]}


class HandOvers:
    """One worker's side of key-group hand-overs: exports sent, parts received for new instances.

    ``pes(deployment)``: the deployment's PEs here (PE id -> PE); ``rpc(address)``: a call to
    another worker (Dask's); ``address()``: this worker's.
    """

    def __init__(self, pes: Callable[[str], dict], rpc: Callable[[str], Any], address: Callable[[], str]) -> None:
        self.pes, self.rpc, self.address = pes, rpc, address
        self.parts: dict[tuple[str, str], list[bytes]] = {}     # (deployment, tag/instance) -> parts
        self.arrived = asyncio.Condition()

    def handlers(self) -> dict[str, Callable]:
        """The worker RPC handlers (the controller's ``pe_handover``, the peers' ``pe_handover_put``)."""
        return {"pe_handover": self.pe_handover, "pe_handover_put": self.pe_handover_put}

    async def pe_handover(self, deployment: str, moves: list[dict]) -> dict:
        """Export these moves' groups from aligned PEs here and send each to its new owner.
        Answers counts only: the state never goes back to the caller."""
        pes = self.pes(deployment)
        parts = []
        for move in moves:
            pe = pes[move["src_pe"]]
            async with pe.turns.lock:
                parts.append((move, exported(pe, move)))
        return await self.send(deployment, parts)

    async def send(self, deployment: str, parts: list[tuple[dict, dict]]) -> dict:
        """Each exported part to its new owner's worker (this one: directly); the bytes sent."""
        sizes = []
        for move, part in parts:
            blob = await asyncio.to_thread(cloudpickle.dumps, part)    # off the loop the PEs run on
            sizes.append(len(blob))
            if move["dst_worker"] == self.address():
                await self.pe_handover_put(deployment, move, blob)
            else:
                await self.rpc(move["dst_worker"]).pe_handover_put(deployment=deployment, move=move, blob=blob)
        return {"moves": len(sizes), "bytes": sum(sizes)}

    async def pe_handover_put(self, deployment: str, move: dict, blob: bytes) -> None:
        """A part for an instance here: imported now by one that runs, kept for a new one."""
        if move["dst_live"]:
            pe = self.pes(deployment)[move["dst_pe"]]
            async with pe.turns.lock:
                import_groups(pe.ops[move["dst"]], cloudpickle.loads(blob)["state"])
            return
        async with self.arrived:
            self.parts.setdefault((deployment, f"{move['tag']}/{move['dst']}"), []).append(bytes(blob))
            self.arrived.notify_all()

    async def resolve(self, spec: PESpec) -> None:
        """Replace the hand-over placeholders of ``spec.restore`` by the state they name, once
        every part is here (bounded by the placeholder's timeout)."""
        for op_id, saved in list(spec.restore.items()):
            if "handover" not in saved:
                continue
            key = (spec.deployment, f"{saved['handover']}/{op_id}")
            async with self.arrived:
                await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.parts.get(key, ())) >= saved["parts"]),
                                       saved["timeout"])
                blobs = self.parts.pop(key)
            cls, params, _key = spec.ops[op_id]
            spec.restore[op_id] = restored(cls, params, [cloudpickle.loads(b) for b in blobs])

    def forget(self, deployment: str) -> None:
        """The deployment ended here: parts never taken (a failed reconfiguration's) go."""
        for key in [k for k in self.parts if k[0] == deployment]:
            del self.parts[key]


def restored(cls: type, params: dict, parts: list[dict]) -> dict:
    """A new instance's restore entry from the parts handed to it (several: merged, at the least
    advanced progress of theirs)."""
    state = parts[0]["state"] if len(parts) == 1 else cls(**params).merge_states([p["state"] for p in parts])
    return {"state": state, "progress": least_progress([p["progress"] for p in parts]), "driver": None}

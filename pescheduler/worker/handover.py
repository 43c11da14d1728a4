"""Key groups of a KEYED operator handed from one instance to another, worker to worker.

A Replicate, Release or Move of a KEYED operator (``control/protocol.py``, the
moves from ``plan/state.py``'s ``group_moves``) moves only the key groups that
change owner, and never through the deploying process:

* the losing instance exports them between two of its PE's turns (an
  instance that stays: in the very turn its PE's routers switch, so it
  processes nothing of them after; an instance going away: once aligned on
  the reconfiguration's marker) together with its watermark progress, and
  this worker sends the bytes straight to the gaining instance's worker over
  Dask's comm between workers (``pe_handover_put``), once the pause is over;
* the gaining instance runs already with those groups gated
  (``pending_groups.py``): an instance that stays gates them before any tuple
  of theirs is routed to it, a new one is deployed at once with them gated
  (its spec names them: ``{"handover": tag, "groups": [...]}`` in
  ``PESpec.restore``). It imports each part between two of its turns and
  then processes the tuples its groups held.

So no move holds the reconfiguration (session 46: every KEYED operator, the
joins and the columnar time window too; before, theirs were built or imported
inside the pause, which grew with the moving state): the losing instance
gives up its groups in the pause (cheap: the groups are taken, packed later),
and once the pause is over this worker cuts them into slices of
:data:`SLICE_GROUPS` groups, pickles and sends them in the background,
and the controller asks when every slice is in (``pe_handover_wait``): the
move's end, in the reconfiguration's record.

An operator exports and imports groups with its own ``export_groups(groups)`` /
``import_groups(state)`` where it has them (the state of the groups, in its
snapshot's form, removed from / added to the running instance: cost of the
moving groups only); any other KEYED operator through ``snapshot``,
``split_state``, ``merge_states`` and ``restore`` (cost of its whole state,
on the worker).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

import cloudpickle

from ..operator import Operator
from ..wire import exported_marker, key_group
from ..state.groups import loads_prepared
from .gc_pause import gc_held
from .lazy_restore import StillLoading, preparer, still_loading
from .pending_groups import PendingGroups
from ..collector import freeze_survivors
from .routing import key_function
from .turns import let_the_loop_run

logger = logging.getLogger(__name__)

SLICE_GROUPS = 4        # key groups per part of a move: the import of one is a short turn


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
    else:
        op.restore(op.merge_states([op.snapshot(), state]))
    freeze_survivors()


def _pickled(held: list) -> bytes:
    """The part in ``held`` pickled, then let go, here in the pickling thread: its containers (a
    taken group's copy of its keys, made as it was packed) are freed here, not on the worker's
    loop. Kept to the end of the move, every part's were freed at once there: at 10^7 keys on
    ``memory`` a Release asked as a Replicate's move ended paused 109-127 ms, its drain waiting
    about 100 ms for that loop (py-spy: a callback with no Python frame, right after the last
    send); 22-26 ms now (bench/rescale_ops.py's ``count``, docs/state-log.md, session 63)."""
    blob = cloudpickle.dumps(held[0])
    held.clear()
    return blob


def exported(pe: Any, move: dict) -> list[dict]:
    """One move's groups out of its instance in ``pe`` as the parts sent (:func:`taken`, cut)."""
    return taken(pe, move).parts()


def taken(pe: Any, move: dict) -> "Taken":
    """One move's groups out of its instance in ``pe`` (call it between the PE's turns), with the
    instance's watermark progress, which a new instance starts from, and the input it carried
    for them (``carried``: group -> tuples, ``carried_input.py``): the whole export, which
    :meth:`Taken.parts` cuts into the parts sent once the pause is over."""
    if move["src"] in still_loading(pe):        # its groups not loaded yet would leave empty
        raise StillLoading(f"{move['src']} still loading the key groups of its restore")
    op, progress = pe.ops[move["src"]], pe.chain.progress()[move["src"]]
    groups = sorted(move["groups"])
    state = export_groups(op, groups)            # one take (a disk store's view is taken once)
    carried = pe.rewirer.carried.take(move["src"], groups) if pe.rewirer.carried is not None else {}
    if carried and not move.get("dst_live"):     # only a running owner's gate takes them
        raise RuntimeError(f"{move['src']} carried input of key groups moved to no running owner ({move['tag']})")
    return Taken(op, {"state": state, "progress": progress, "groups": groups, "carried": carried})


class Taken:
    """A move's groups as its instance gave them up, in the pause: cut into the parts sent after it
    (:meth:`parts`). The cut walks the export (a count window's waiting tuples once per level of
    halves): 2-7 ms of a Move's pause at 10^6 keys with 5,600 tuples waiting, when it was cut in
    the pause."""

    def __init__(self, op: Operator, whole: dict) -> None:
        self.op, self.whole = op, whole

    def count(self) -> int:
        """How many parts :meth:`parts` makes."""
        groups = len(self.whole["groups"])
        return -(-groups // SLICE_GROUPS) if self._cut() else 1

    def _cut(self) -> bool:
        return hasattr(self.op, "export_groups") and len(self.whole["groups"]) > SLICE_GROUPS

    def parts(self) -> list[dict]:
        """One part, or for an operator with its own ``export_groups``, a part per slice of
        :data:`SLICE_GROUPS` groups (the export let go: the parts hold what it held)."""
        cut, whole, op, groups = self._cut(), self.whole, self.op, self.whole["groups"]
        self.whole = None
        if not cut:
            return [whole]
        carried = whole["carried"]
        return [{"state": part, "progress": whole["progress"], "groups": s,
                 "carried": {g: carried[g] for g in s if g in carried}}
                for part, s in sliced(op, whole.pop("state"), groups)]


def wanted_first(parts: list[tuple[dict, dict]], move: dict, wanted: list[int]) -> None:
    """``parts`` (still to send) reordered in place: those bringing move ``move``'s instance a
    ``wanted`` group first, in ``wanted``'s order; the rest as they were (stable)."""
    if not wanted:
        return
    rank, to = {g: i for i, g in enumerate(wanted)}, (move["dst_pe"], move["dst"])

    def first(entry: tuple[dict, dict]) -> int:
        m, part = entry
        if (m["dst_pe"], m["dst"]) != to:
            return len(rank)
        return min((rank[g] for g in part["groups"] if g in rank), default=len(rank))
    parts.sort(key=first)


def sliced(op: Operator, state: Any, groups: list[int]) -> list[tuple[Any, list[int]]]:
    """``state`` (``op``'s export of ``groups``, sorted) cut into its slices of
    :data:`SLICE_GROUPS` groups, with each slice's groups: halved, each half cut again, so each
    level of halves walks the state once (``split_state`` of a part is a part), and each key's
    group is computed once. In the pause of a Move (every group of the PE, 32 slices), a split of
    the whole export for each slice walked a count window's waiting tuples 32 times: 17 of the
    19 ms of the export at 10^3 keys."""
    memo: dict = {}

    def group_of(key: Any) -> int:
        try:
            g = memo.get(key)
        except TypeError:                    # an unhashable key: computed each time
            return key_group(key)
        if g is None:
            g = memo[key] = key_group(key)
        return g

    def cut(part: Any, of: list[int]) -> list[tuple[Any, list[int]]]:
        if len(of) <= SLICE_GROUPS:
            return [(part, of)]
        at = SLICE_GROUPS * (-(-len(of) // SLICE_GROUPS) // 2)      # half the slices, rounded down
        left, right = frozenset(of[:at]), frozenset(of[at:])
        return (cut(op.split_state(part, lambda key: group_of(key) in left), of[:at])
                + cut(op.split_state(part, lambda key: group_of(key) in right), of[at:]))
    return cut(state, groups)


def exported_live(pe: Any, moves: list[dict]) -> list[tuple[dict, "Taken"]]:
    """Moves' groups out of a running instance, in the turn its routers switch: what each took, and
    behind all its PE emitted so far, on each of its output channels, the move's
    :func:`~pescheduler.wire.exported_marker`. The gaining instance's output for those groups goes
    on other channels into the same PEs downstream: its state leaves only once each of them took
    the marker (the controller waits for it), or under load a slow consumer processed the new
    instance's output for a key before the old one's (a key's running sums out of order)."""
    parts = [(m, taken(pe, m)) for m in moves]
    for tag in dict.fromkeys(m["tag"] for m in moves):
        for _spec, channel in pe.ports.outs:
            channel.marker(exported_marker(tag))
    return parts


def gate(pe: Any, op_id: str, groups, tag: str) -> PendingGroups:
    """Gate running instance ``op_id`` of ``pe`` on ``groups`` (call it between the PE's turns)."""
    found = pe.rewirer.pending.get(op_id)
    if found is not None and not found.done:
        raise RuntimeError(f"{op_id} still waits for key groups of {found.tag}")
    pe.rewirer.pending[op_id] = PendingGroups(pe.chain, op_id, groups, key_function(pe.spec.ops[op_id][2]), tag)
    return pe.rewirer.pending[op_id]


class HandOvers:
    """One worker's side of key-group hand-overs: exports sent, parts received for new instances.

    ``pes(deployment)``: the deployment's PEs here (PE id -> PE); ``rpc(address)``: a call to
    another worker (Dask's); ``address()``: this worker's.
    """

    def __init__(self, pes: Callable[[str], dict], rpc: Callable[[str], Any], address: Callable[[], str],
                 stop: Callable[[str, list[str]], Awaitable[list[str]]] | None = None,
                 snapshot: Callable[[str, list[str], list[str]], Awaitable[bytes]] | None = None) -> None:
        self.pes, self.rpc, self.address, self.stop, self.snapshot = pes, rpc, address, stop, snapshot
        self.early: dict[tuple[str, str], list[tuple[dict, bytes]]] = {}    # parts that came before their PE
        self.gates: dict[tuple[str, str], list[PendingGroups]] = {}        # (deployment, tag) -> gates here
        self.failed: dict[tuple[str, str], str] = {}            # (deployment, tag) -> why a part was lost
        self.sending: set[asyncio.Task] = set()
        self.arrived = asyncio.Condition()
        self.go: dict[tuple[str, str], asyncio.Event] = {}       # (deployment, tag) -> its pause is over

    def handlers(self) -> dict[str, Callable]:
        """The worker RPC handlers (the controller's ``pe_handover``, ``pe_handover_expect`` and
        ``pe_handover_wait``, the peers' ``pe_handover_put``)."""
        return {"pe_handover": self.pe_handover, "pe_handover_put": self.pe_handover_put,
                "pe_handover_expect": self.pe_handover_expect, "pe_handover_wait": self.pe_handover_wait,
                "pe_handover_go": self.pe_handover_go}

    async def pe_handover_go(self, deployment: str, tag: str) -> None:
        """Reconfiguration ``tag``'s pause is over: its parts here are packed and sent now."""
        self.go.setdefault((deployment, tag), asyncio.Event()).set()

    async def pe_handover(self, deployment: str, moves: list[dict], stop: list[str] = (),
                          snapshot: list[str] = (), leave_out: list[str] = ()) -> dict:
        """Export these moves' groups from aligned PEs here and send each to its new owner, in the
        background once the pause is over (answering at once). Answers counts, and no key group:
        the state of the groups never goes back to the caller.

        ``snapshot``: retired PEs here whose other operators' states (but those ``leave_out``
        names: their groups just left) are answered after the export, as ``PEHost.pe_snapshot``
        answers them (``"snapshot"``). ``stop``: PEs here that then stop (``PEHost.pe_stop``),
        in this very call: retired PEs with nothing left to snapshot once their groups left (a
        Release's copy), or snapshotted just before (a Move's PE). The snapshot and the stop were
        round trips of their own to this worker's loop in the pause (``protocol.execute``): a
        Move's pause was five rounds of calls, 62-129 ms at 10^3 keys."""
        pes = self.pes(deployment)
        parts = []
        for move in moves:
            pe = pes[move["src_pe"]]
            async with pe.turns.lock:
                parts.append((move, taken(pe, move)))
        for pe_id in dict.fromkeys(m["src_pe"] for m in moves):
            carried = pes[pe_id].rewirer.carried
            if carried is not None and carried.left():      # of a group no move took: never lost silently
                raise RuntimeError(f"{pe_id} carried {carried.left()} tuples of key groups it gives to no one")
        answer = await self.send(deployment, parts)
        if snapshot:
            if self.snapshot is None:
                raise RuntimeError(f"asked to snapshot {list(snapshot)}, with no way to snapshot PEs here")
            answer["snapshot"] = await self.snapshot(deployment, list(snapshot), list(leave_out))
        if stop:
            if self.stop is None:
                raise RuntimeError(f"asked to stop {list(stop)}, with no way to stop PEs here")
            answer["stopped"] = await self.stop(deployment, list(stop))
        return answer

    async def pe_handover_expect(self, deployment: str, moves: list[dict]) -> dict:
        """Running instances here gate the groups these moves bring them, before any router
        switches to them (``pending_groups.py``)."""
        pes, wanted = self.pes(deployment), {}
        for move in moves:
            wanted.setdefault((move["dst_pe"], move["dst"], move["tag"]), []).extend(move["groups"])
        for (pe_id, op_id, tag), groups in wanted.items():
            pe = pes[pe_id]
            async with pe.turns.lock:
                self.gates.setdefault((deployment, tag), []).append(gate(pe, op_id, groups, tag))
        return {"gated": sum(len(g) for g in wanted.values())}

    async def send(self, deployment: str, parts: list[tuple[dict, "Taken | dict"]]) -> dict:
        """What each move took (:func:`taken`; or a part as it goes) to its new owner's worker
        (this one: directly), in a background task once the pause is over (the reconfiguration
        does not wait)."""
        if parts:
            task = asyncio.create_task(self._send_later(deployment, parts))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)
        return {"parts": sum(x.count() if type(x) is Taken else 1 for _m, x in parts)}

    async def _deliver(self, deployment: str, move: dict, blob: bytes) -> dict | None:
        """A packed part to its new owner's worker (this one: directly); answers once it is imported,
        with the groups tuples wait for there (:meth:`pe_handover_put`)."""
        if move["dst_worker"] == self.address():
            return await self.pe_handover_put(deployment, move, blob)
        return await self.rpc(move["dst_worker"]).pe_handover_put(deployment=deployment, move=move, blob=blob)

    async def _send_later(self, deployment: str, parts: list[tuple[dict, "Taken | dict"]]) -> None:
        """Deferred parts, one after another (a slice's import waits for no other slice), once the
        pause is over (the move's ``go``: bounded by the reconfiguration's timeout); what a move
        took is cut into its parts then (:meth:`Taken.parts`). Each part is let go as it is
        packed (:func:`_pickled`), so ``parts`` empties as it goes.

        Packing and importing overlap: the next part is pickled in a thread here while the last
        one is sent and imported there (``pe_handover_put`` answers once its groups are in), so a
        move takes about the longer of the two per part, not their sum, and at most two parts are
        packed at once. One after the other, a Move of 10^6 keys on ``memory`` spent 15-50 ms
        packing a part, then 20-40 ms waiting for its import, both workers in turn idle.

        The groups tuples wait for go first: each import answers the pending groups its gates hold
        tuples of, the most first, and the parts not packed yet are taken in that order (the others
        in group order), so a hot key's group is not the last of a long move (Megaphone's fetch on
        first touch; a part packed ahead is sent as it is)."""
        bound, tag = parts[0][0].get("go"), parts[0][0]["tag"]
        if bound is not None:
            key = (deployment, tag)
            try:
                await asyncio.wait_for(self.go.setdefault(key, asyncio.Event()).wait(), bound)
            except asyncio.TimeoutError:
                logger.warning("no end of the pause of %s came: its key groups go now", key[1])
            self.go.pop(key, None)

        def pack_next() -> tuple[dict, asyncio.Future] | None:
            if not parts:
                return None
            move, part = parts.pop(0)
            held = [part]
            del part
            return move, asyncio.ensure_future(asyncio.to_thread(_pickled, held))   # off the PEs' loop
        packing = None
        try:
            parts[:] = [(m, part) for m, x in parts for part in (x.parts() if type(x) is Taken else (x,))]
            packing = pack_next()
            while packing is not None:
                move, blob = packing[0], await packing[1]
                packing = pack_next()
                answer = await self._deliver(deployment, move, blob)
                del blob
                wanted_first(parts, move, (answer or {}).get("wanted", ()))
        except Exception as exc:      # the gaining instance's groups stay gated: the wait says why
            logger.error("hand-over of %s failed", tag, exc_info=True)
            if packing is not None:     # its thread runs on: its outcome read, not left to the loop's log
                packing[1].add_done_callback(lambda done: done.cancelled() or done.exception())
            await self._fail(deployment, tag, f"sending key groups failed: {exc!r}")

    async def _fail(self, deployment: str, tag: str, why: str) -> None:
        async with self.arrived:
            self.failed[(deployment, tag)] = why
            self.arrived.notify_all()

    async def pe_handover_put(self, deployment: str, move: dict, blob: bytes) -> dict:
        """A part for a gated instance here: imported now, or as soon as its PE is built (a new
        one's, :meth:`adopt`). Answers ``wanted``: the groups of this move that tuples wait for
        here, the most waited-for first (the sender sends their parts next: :meth:`_send_later`)."""
        pe = self.pes(deployment).get(move["dst_pe"])
        if pe is None or move["dst"] not in pe.rewirer.pending:
            self.early.setdefault((deployment, move["dst_pe"]), []).append((move, bytes(blob)))
        else:
            await self._import(deployment, pe, move, blob)
        return {"wanted": self.wanted(deployment, move["tag"], move["dst_pe"], move["dst"])}

    def wanted(self, deployment: str, tag: str, pe_id: str, op_id: str) -> list[int]:
        """The pending groups of move ``tag`` into instance ``op_id`` of ``pe_id`` here that tuples
        wait for, the most first (none while its PE is not built yet)."""
        pe = self.pes(deployment).get(pe_id)
        gated = pe.rewirer.pending.get(op_id) if pe is not None else None
        return gated.waited_for() if gated is not None and gated.tag == tag else []

    async def _import(self, deployment: str, pe: Any, move: dict, blob: bytes) -> None:
        """One part into its gated instance: unpickled and made ready for the store in a
        thread (``loads_prepared``, as a lazy restore reads a group), then installed one key group
        at a time, each between two of the PE's turns, the tuples it held going through right
        after, in the same turn. A part of four groups installed at once held a PE 370-420 ms
        at a time after a Release at 10^7 keys (traced); a group is 1/128th of the state. The
        loop runs between two groups (:func:`let_the_loop_run`: the lock, free, does not yield):
        back to back, a part's four groups, each with the tuples it held, stopped the loop
        100-200 ms once a part, and a source on that loop with it, so the stream stopped too
        (``disk`` at 10^7 keys, traced)."""
        try:
            part = await asyncio.to_thread(gc_held, loads_prepared, blob, preparer(pe))
            gated = pe.rewirer.pending[move["dst"]]
            groups, op_id, carried = part["groups"], move["dst"], part.get("carried") or {}
            for i, g in enumerate(groups):
                if i:
                    await let_the_loop_run()
                async with pe.turns.lock:
                    op = pe.ops[op_id]
                    gated.carried(g, carried.get(g, ()))
                    state = part["state"] if len(groups) == 1 else \
                        op.split_state(part["state"], lambda key, g=g: key_group(key) == g)
                    fresh = gated.fresh and not gated.parts     # a new instance: built from its first group
                    if g == groups[0]:
                        gated.parts += 1
                        gated.bytes += len(blob)
                    if fresh:
                        gated.install([g], lambda: op.restore(state))
                        freeze_survivors()
                    else:
                        gated.install([g], lambda: import_groups(op, state))
                pe.ports.wake()
        except Exception as exc:
            logger.error("import of key groups %s failed", move["tag"], exc_info=True)
            await self._fail(deployment, move["tag"], f"importing key groups into {move['dst']} failed: {exc!r}")
            return
        async with self.arrived:
            self.arrived.notify_all()

    def adopt(self, deployment: str, pe: Any) -> None:
        """A PE just built (chain and gates in place): note its gates and import what came early."""
        for gated in pe.rewirer.pending.values():
            self.gates.setdefault((deployment, gated.tag), []).append(gated)
        for move, blob in self.early.pop((deployment, pe.pe_id), ()):
            task = asyncio.create_task(self._import(deployment, pe, move, blob))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    async def pe_handover_wait(self, deployment: str, tag: str, timeout: float) -> dict:
        """Until every gate here of reconfiguration ``tag`` has all its groups (bounded): the
        groups and bytes moved, those still pending, and when the last one came in."""
        key = (deployment, tag)

        def finished() -> bool:
            return key in self.failed or all(g.done for g in self.gates.get(key, ()))
        async with self.arrived:
            try:
                await asyncio.wait_for(self.arrived.wait_for(finished), timeout)
            except asyncio.TimeoutError:
                pass
        gates = self.gates.get(key, [])
        if finished():
            self.gates.pop(key, None)
        figures = [g.figures() for g in gates]
        return {"groups": sum(f["groups"] for f in figures), "pending": sum(f["pending"] for f in figures),
                "bytes": sum(f["bytes"] for f in figures), "buffered": sum(f["buffered"] for f in figures),
                "peak": max((f["peak"] for f in figures), default=0),
                "longest_import_s": max((f["longest_import_s"] for f in figures), default=0.0),
                "carried": sum(f["carried"] for f in figures), "waited_s": sum(f["waited_s"] for f in figures),
                "done_at": time.time(), "failed": self.failed.pop(key, None)}

    def forget(self, deployment: str) -> None:
        """The deployment ended here: parts never taken (a failed reconfiguration's) go."""
        for table in (self.early, self.gates, self.failed, self.go):
            for key in [k for k in table if k[0] == deployment]:
                del table[key]


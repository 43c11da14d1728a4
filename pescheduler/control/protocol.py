"""One reconfiguration protocol for every change of placement (fuse, split, move, ...).

Given the placement before and after, PEs whose operators and worker are the
same keep running untouched; the others are *retired* and replaced by
*created* ones. Then:

0. **Open, before the pause**, where nothing retires (a Replicate; ``_opens_early``):
   the created PEs are deployed and started, and their channels opened (their
   downstream PEs' new inputs registered, their upstream PEs' new outputs
   opened), with nothing routed to them yet. Step 4 then only switches.

1. **Pause at a marker.** Every unchanged PE feeding a retired one sends a
   marker on that channel and holds it (what it emits next waits in its
   buffer). Retired PEs pause their sources. Where everything the channel's
   data will be re-sent to is a created PE, or the channel feeds a copy that
   carries (step 2), the marker overtakes what the channel still buffers, which
   is re-sent with the rest (``_overtakable``).
2. **Drain.** A retired PE that has the marker (or END) on every input has
   processed everything before it; it sends the marker on all its outputs and
   holds them (aligned, as Flink aligns checkpoint barriers). Unchanged PEs fed
   by retired ones take the marker behind the last data the old PEs produced,
   so they have processed all of it before any data of the new PEs exists.
   The drain fails only when nothing ahead of the markers moves for the
   timeout (``_wait_drained``). Where the retired PEs' key groups all go to
   running instances that gate them (a Release's copy: ``_late_seen``), the
   PEs downstream need only have the marker in their inbox, behind the copy's
   last batches; they take it after the pause, and the groups' state leaves
   only then (the order wait), so the pause holds no consumer's backlog. Nor
   the copy's own: its queued input goes with its key groups, through the
   gate ahead of what the gate holds, where its operators allow
   (``plan.carry``, ``worker/carried_input.py``).
3. **Hand over key groups, snapshot** the retired PEs' operator state, watermark
   progress and source positions, and stop them. A KEYED operator's instances
   in retired PEs first send the key groups that change owner straight to their
   new owners' workers (``worker/handover.py``; a running owner imports them
   now, a created one is built from them), so the snapshot that reaches this
   process holds none of that state. A retired PE that exports groups is
   snapshotted (what else it holds) and stopped in that same call, right after
   its export (a Move's pause: three rounds of calls to busy worker loops, not
   five).
4. **Re-wire and restore**, in one round of parallel calls: created PEs are
   built from the snapshots (and the handed-over groups) and started,
   downstream PEs register the new input channels, upstream PEs point their
   held channels at the created PEs, switch their routers and re-send what
   they held; a KEYED instance that stays and gives groups to a new copy
   exports them in that very turn of its PE (it runs the routers:
   ``group_moves``). A channel whose receiver is not there yet waits for it at
   the receiving worker; data never reaches a receiver before it exists, and a
   receiver opened in step 0 keeps what it carries in its PE's inbox until the
   PE's rewire gives it its edge (``ChannelIn.wired``), so no call needs
   another's answer.
5. **Resume.**

PEs of a KEYED operator's instances that keep their worker are not replaced
(a Replicate leaves the original running; a Release retires only the copy),
unless one of them would give groups to another copy outside its routers' PE:
then every instance is replaced and the state re-split here (``keyed_rebalanced``).

Nothing before the marker is processed by a new PE and nothing after it by an
old one, so no tuple is lost or duplicated, and per-key order holds because
every channel is FIFO and the old path is drained before the new one starts.
The marker is opaque data carried in-band; checkpoint barriers travel the same
path (``worker/barriers.py``), and the Reconfigurer's lock keeps the two apart.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Awaitable, Callable

import cloudpickle

from ..plan.placement import Placement
from ..plan.state import GroupMove, carries, group_moves, keyed_rebalanced, redistribute
from ..wire import InputSpec, exported_marker
from ..plan.wiring import ChannelKey, build_specs, channel_ids, consumer_edges, copy_map, output_spec, routing_for
from .gateway import WorkerGateway


@dataclass(frozen=True)
class ReconfigurationPlan:
    """Which PEs go and come, and which channels, inputs and routers of the PEs that stay change."""

    retired: tuple[str, ...]
    created: tuple[str, ...]
    hold: dict[str, list[str]]                 # upstream PE -> its channels into retired PEs
    seen: dict[str, list[str]]                 # downstream PE -> its channels from retired PEs
    channels: dict[ChannelKey, str]            # every channel of the new placement
    upstream_outputs: dict[str, list[ChannelKey]] = field(default_factory=dict)  # new channels of staying PEs
    downstream_inputs: dict[str, list[ChannelKey]] = field(default_factory=dict)
    edges: dict[str, list] = field(default_factory=dict)      # staying PE -> its consumer edges, if changed
    routing: dict[str, dict] = field(default_factory=dict)    # staying PE -> its routers, if changed
    released: tuple[str, ...] = ()             # retired copies that have no successor
    epoch: int = 0                             # the epoch it makes (its PEs' specs carry it)
    overtake: dict[str, list[str]] = field(default_factory=dict)  # held channels the marker may overtake on
    moves: tuple[GroupMove, ...] = ()          # KEYED operators' key groups that change owner, worker to worker
    ordered: dict[str, list[str]] = field(default_factory=dict)  # downstream PE -> its channels from a running exporter
    late_seen: dict[str, list[str]] = field(default_factory=dict)  # downstream PE -> channels it may drain after the pause
    carry: tuple[str, ...] = ()                # handing retired PEs whose operators all carries(): their queued input goes too
    overdraw: dict[str, list[str]] = field(default_factory=dict)  # retired PE -> its channels into late_seen PEs (_overdrawn)

    @property
    def moved(self) -> bool:
        return bool(self.retired or self.created)


def plan_reconfiguration(old: Placement, new: Placement, old_channels: dict[ChannelKey, str],
                         deployment: str, epoch: int, force: tuple[str, ...] = ()) -> ReconfigurationPlan:
    """The difference between two placements as the protocol needs it (pure).

    ``force``: PEs to replace even though their operators and worker stay
    (instances of a KEYED operator whose key groups change owner, where they
    cannot move from a running instance: ``group_moves``).
    """
    moving = group_moves(old, new)
    force = set(force) | keyed_rebalanced(old, new, frozenset(moving))
    same = {pe_id for pe_id, pe in old.pes.items()
            if pe_id in new.pes and pe_id not in force
            and (new.pes[pe_id].operators, new.pes[pe_id].worker) == (pe.operators, pe.worker)}
    retired = tuple(p for p in old.pes if p not in same)
    created = tuple(p for p in new.pes if p not in same)
    keep = {key: cid for key, cid in old_channels.items()
            if key[2] in same and old.pe_of(key[0]) in same and key[0] in new.plan.ops
            and new.pe_of(key[0]) in same}
    channels = channel_ids(new, deployment, epoch, keep)
    hold: dict[str, list[str]] = {}
    seen: dict[str, list[str]] = {}
    for (src, port, dst_pe), cid in old_channels.items():
        src_pe = old.pe_of(src)
        if src_pe in same and (dst_pe in retired or cid not in channels.values()):
            hold.setdefault(src_pe, []).append(cid)
        if src_pe in retired and dst_pe in same:
            seen.setdefault(dst_pe, []).append(cid)
    upstream: dict[str, list[ChannelKey]] = {}
    downstream: dict[str, list[ChannelKey]] = {}
    for key, cid in channels.items():
        if key in keep:
            continue
        src_pe = new.pe_of(key[0])
        if src_pe in same:
            upstream.setdefault(src_pe, []).append(key)
        if key[2] in same:
            downstream.setdefault(key[2], []).append(key)
    edges = _changed(same, consumer_edges, old, new)
    routing = _changed(same, routing_for, old, new)
    released = tuple(p for p in retired if p not in new.pes and old.pes[p].copy_of)
    moves = tuple(m for ms in moving.values() for m in ms)
    handing = _handing(old, moves, retired)
    carry = tuple(p for p in retired if p in handing and all(carries(old.plan.ops[x]) for x in old.pes[p].operators))
    overtake = _overtakable(old, new, old_channels, hold, set(retired), set(created), set(carry))
    late_seen = _late_seen(old, old_channels, seen, downstream, handing)
    return ReconfigurationPlan(retired, created, hold, seen, channels, upstream, downstream,
                               edges, routing, released, epoch, overtake, moves,
                               _ordered(old, old_channels, moves, same, set(channels.values())),
                               late_seen, carry, _overdrawn(old, old_channels, late_seen))


def _handing(old: Placement, moves: tuple[GroupMove, ...], retired: tuple[str, ...]) -> set[str]:
    """The retired PEs every operator of which gives all its key groups to running instances that
    gate them (moves to a live owner: a Release's copy). Nothing else will emit what
    they would have: every tuple of those groups waits at the gate until its state is imported.
    So their consumers may take their last batches after the pause (:func:`_late_seen`), and
    their queued input may go with the groups instead of through them (``plan.carry``,
    ``worker/carried_input.py``): it goes through the gate ahead of what the gate holds."""
    gating: dict[str, bool] = {}
    for m in moves:
        gating[m.src] = gating.get(m.src, True) and m.dst_live and not m.src_live
    return {p for p in retired if old.pes[p].operators and all(gating.get(x, False) for x in old.pes[p].operators)}


def _late_seen(old: Placement, old_channels: dict[ChannelKey, str], seen: dict[str, list[str]],
               downstream: dict[str, list[ChannelKey]], handing: set[str]) -> dict[str, list[str]]:
    """Downstream PE -> its channels from retired PEs whose marker it may take after the pause:
    the drain waits only until the marker is in its inbox (behind all the channel carried), the
    retired PE stops, and the PE works off those last batches while the stream runs on.

    Only for channels from ``handing`` PEs (:func:`_handing`): nothing else will emit what those
    channels would have carried, and the parts are sent only once this PE took the
    marker (``execute``'s order wait, then the ``go``), so the new owner's output for a key
    comes after the old one's, and per-key order and exactly once hold as when the pause
    waited (session 21: 119 of a 166 ms Release at 10^6 keys on disk was the consumer's backlog).
    And only for a PE none of whose channels from retired PEs need the take and that gets no new
    input: its rewire (the removal of those inputs) then comes after the take, all at once."""
    src_of = {cid: old.pe_of(src) for (src, _port, _dst), cid in old_channels.items()}
    return {pe_id: list(cids) for pe_id, cids in seen.items()
            if pe_id not in downstream and cids and all(src_of.get(c) in handing for c in cids)}


def _overdrawn(old: Placement, old_channels: dict[ChannelKey, str],
               late_seen: dict[str, list[str]]) -> dict[str, list[str]]:
    """Retired PE -> its output channels into :func:`_late_seen` PEs: from the pause on, they ship
    what they buffer, what the PE still emits and the marker without waiting for credit
    (``CreditGate.overdraw``, as Flink's overdraft buffers let a task finish a record out of
    buffers).

    The marker need only be queued at the consumer, but on credit it is queued only once the
    consumer took what the copy's channel had shipped and freed credit for all it still buffered:
    up to two credit windows more (flow.py's full channel). A window's copy into a slow consumer
    paused a Release for 10.2 s (six busy loops; ``drain ... queued`` 10,151 ms). Overdrawn, the
    consumer's inbox holds those batches instead of the copy's buffer (the same bound, once per
    released copy) and works them off after the pause, in the order wait, as it did its credit
    window; the original holds the copy's key groups' tuples until then, as before."""
    late = {cid for cids in late_seen.values() for cid in cids}
    out: dict[str, list[str]] = {}
    for (src, _port, _dst_pe), cid in old_channels.items():
        if cid in late:
            out.setdefault(old.pe_of(src), []).append(cid)
    return out


def _ordered(old: Placement, old_channels: dict[ChannelKey, str], moves: tuple[GroupMove, ...],
             same: set[str], kept: set[str]) -> dict[str, list[str]]:
    """Downstream PE -> its channels from a PE that exports key groups while it runs (a move's
    ``src_live``): the channels whose :func:`~pescheduler.wire.exported_marker` each such PE must
    take before the gaining instance may go on (``execute``): the move's groups leave then."""
    exporters = {m.src_pe for m in moves if m.src_live}
    out: dict[str, list[str]] = {}
    for (src, _port, dst_pe), cid in old_channels.items():
        if old.pe_of(src) in exporters and dst_pe in same and dst_pe not in exporters and cid in kept:
            out.setdefault(dst_pe, []).append(cid)
    return out


def _overtakable(old: Placement, new: Placement, old_channels: dict[ChannelKey, str],
                 hold: dict[str, list[str]], retired: set[str], created: set[str],
                 carry: set[str] = frozenset()) -> dict[str, list[str]]:
    """The held channels whose marker may go ahead of what they buffer (ChannelOut.hold): those
    into a retired PE whose every re-send target (each instance, in the new placement, of an
    operator the channel served) runs in a created PE, or into a PE that carries (``plan.carry``).

    Why only those: the buffered data is then processed by a PE that starts after the old one
    drained, from its snapshot, which holds nothing of that data, and behind nothing else of
    this channel. A PE that stays could still have the old channel's earlier batches in flight
    when the re-sent ones arrive on another channel, except where it gates the groups they
    belong to and the old channel's earlier batches come with the groups, ahead of everything
    the gate holds: a copy that carries (what of its inbox it processed is in the groups'
    state, the rest is carried). Its operators judge no tuple by the watermark (``carries``),
    so the backlog may reach the original behind watermarks the original already took. Under
    load that drain was the copy working through its upstream's backlog (a Release at 10^7
    keys on disk beside two busy loops: 315 ms, 223 of them the drain).

    And only where the channel served every consumer of its port: a fanned-out batch shipped
    on one channel and overtaken on another would be re-sent to a new PE that runs both
    consumers, and the first would take it twice (the property test under load found "a
    number doubled" after a Fuse). Under load this keeps a drain from waiting behind each
    holder's backlog (issue 20: drains grew 0.5 -> 9 s).
    """
    out: dict[str, list[str]] = {}
    held = {cid for cids in hold.values() for cid in cids}
    for (src, port, dst_pe), cid in old_channels.items():
        if cid not in held or dst_pe not in retired:
            continue
        members = set(old.pes[dst_pe].operators)
        served = {old.original(d) for s, p, d in old.plan.edges if (s, p) == (src, port) and d in members}
        everyone = {old.original(d) for s, p, d in old.plan.edges if (s, p) == (src, port)}
        if not served or served != everyone or not served <= set(new.plan.ops):
            continue                   # fan-out: a re-sent batch would reach a consumer that had it
        if dst_pe in carry or {new.pe_of(i) for x in served for i in new.instances(x)} <= created:
            out.setdefault(old.pe_of(src), []).append(cid)
    return out


def _changed(pes, of, old: Placement, new: Placement) -> dict:
    """``of(new, pe)`` for each PE in ``pes`` where it differs from ``of(old, pe)``."""
    out = {}
    for pe in pes:
        now = of(new, pe)
        if now != of(old, pe):
            out[pe] = now
    return out


@dataclass
class ApplyRecord:
    """What applying an action did: applied or refused (with the reason), pause, what moved."""

    action: object
    applied: bool
    reason: str = ""
    pause_ms: float = 0.0
    retired: tuple[str, ...] = ()
    created: tuple[str, ...] = ()
    moved: dict[str, tuple[str, str]] = field(default_factory=dict)     # op -> (old PE, new PE)
    at: float = field(default_factory=time.time)
    steps: dict[str, float] = field(default_factory=dict)    # protocol step -> ms (where the pause went)

    def as_dict(self) -> dict:
        return {"action": repr(self.action), "applied": self.applied, "reason": self.reason,
                "pause_ms": round(self.pause_ms, 3), "retired": list(self.retired),
                "created": list(self.created), "moved": {k: list(v) for k, v in self.moved.items()},
                "steps": dict(self.steps)}


class ReconfigurationFailed(RuntimeError):
    """The protocol could not complete (a PE failed or did not align in time)."""


async def execute(gateway: WorkerGateway, old: Placement, new: Placement, plan: ReconfigurationPlan,
                  worker_info: dict, marker: str, timeout: float, steps: dict[str, float] | None = None) -> float:
    """Run the protocol through ``gateway`` (the deployment's calls to its PE hosts); returns the
    pause in seconds and the milliseconds each step took (``steps``, filled in as they run)."""
    steps = {} if steps is None else steps
    by_worker: dict[str, dict] = {}
    for pe_id, channels in plan.hold.items():
        todo = by_worker.setdefault(old.pes[pe_id].worker, {"hold": {}, "align": [], "release": [], "overtake": {}})
        todo["hold"][pe_id] = channels
        if pe_id in plan.overtake:
            todo["overtake"][pe_id] = plan.overtake[pe_id]
    for pe_id in plan.retired:
        todo = by_worker.setdefault(old.pes[pe_id].worker, {"hold": {}, "align": [], "release": [], "overtake": {}})
        todo["align"].append(pe_id)
        if pe_id in plan.released:
            todo["release"].append(pe_id)
        if pe_id in plan.carry:
            todo.setdefault("carry", []).append(pe_id)
        if pe_id in plan.overdraw:
            todo.setdefault("overdraw", {})[pe_id] = plan.overdraw[pe_id]

    async def step(name: str, coro, limit: float | None = timeout) -> Any:
        t = time.perf_counter()
        try:
            return await asyncio.wait_for(coro, limit)
        except asyncio.TimeoutError:
            raise ReconfigurationFailed(f"step {name!r} took more than {timeout:.0f}s") from None
        finally:
            steps[name] = round((time.perf_counter() - t) * 1000, 3)

    workers = sorted(set(old.workers) | set(new.workers))
    early = _opens_early(plan)
    if early:               # the created PEs and every new channel, before the pause (_opens_early)
        await step("open", _wait_calls(gateway, workers, lambda: _open_early(
            gateway, new, plan, worker_info, _created_states(old, new, {}, plan, marker), steps),
            timeout, steps, "open"), limit=None)         # bounds itself on standing still, as the drain
    t0 = time.perf_counter()
    states: dict[str, dict] = {}
    folded: str | None = None
    if by_worker:           # a copy added beside PEs that all stay has nothing to pause (issue 15)
        # Each pause call also answers the drain's first look on its worker (``first``), and the
        # retired PEs with nothing to snapshot stop in their hand-over's call (``stopping``): a
        # Release was five round trips to busy worker loops in its pause, each 8-41 ms at 10^6
        # keys (a PE's turn, a GC, the checkpoint writer holding the GIL); now three.
        wall, first = time.time(), {}
        await step("pause", _pause(gateway, old, plan, by_worker, marker, timeout, first))
        await step("drain", _wait_drained(gateway, old, plan, marker, timeout, steps, first, wall),
                   limit=None)  # bounds itself
        leave_out = _handed_over(old, plan)
        stopping = _stopped_with_hand_over(old, plan, leave_out)
        folded = _switch_with_hand_over(plan, stopping)
        snapped: set[str] = set()
        if folded is None:
            snapped = _snapshotted_with_hand_over(plan, stopping)
            states = await step("handover", _hand_over_retired(gateway, plan, marker, timeout, stopping,
                                                               snapshot=snapped, leave_out=leave_out))
        states.update(await step("snapshot", _snapshot(gateway, old, [p for p in plan.retired if p not in snapped],
                                                       leave_out)))
        await step("stop", asyncio.gather(*(gateway.stop_pes(old.pes[p].worker, [p])
                                            for p in plan.retired if p not in stopping | snapped)))
    states = _created_states(old, new, states, plan, marker)
    # One round of calls in parallel (issue 15: a copy's activation; it was three in a row, then
    # two). Nothing orders them: a channel opened to a receiver that is not there yet (a created
    # PE still being deployed, an input its downstream PE has not registered yet) waits for it
    # at the receiving worker (PEHost._expect), and no PE waits for its channels to open
    # (ChannelOut.open_in_background). So a copy works from the moment its upstream routes to
    # it, while its own output channel still waits for the downstream worker's busy loop.
    late = set(plan.late_seen)      # PEs that take the retired ones' marker after the pause
    gating = {folded: [m for ms in _gates(plan, marker, timeout).values() for m in ms]} if folded else {}

    def activation():
        return asyncio.gather(*([] if early else [_deploy_created(gateway, new, plan, worker_info, states, steps)]),
                              _rewire_downstream(gateway, new, plan, steps, skip=late),
                              _rewire_upstream(gateway, new, plan, worker_info, steps, marker, timeout, gating),
                              *([_hand_over_retired(gateway, plan, marker, timeout, stopping, gate=False)]
                                if folded else []))
    what = "handover + switch" if folded else "switch" if early else "deploy + start + rewire"
    await step(what, _wait_calls(gateway, workers, activation, timeout, steps, what),
               limit=None)          # bounds itself on standing still, as the drain
    pause = time.perf_counter() - t0
    if plan.ordered:            # a running exporter's output for its groups first (exported_marker)
        await step("order: downstream took the exporter's marker",
                   _wait_marker(gateway, old, {}, plan.ordered, exported_marker(marker), timeout, steps, "order"),
                   limit=None)  # bounds itself, as the drain
    if late:                    # the retired PEs' last batches taken downstream first (_late_seen)
        await step("order: downstream took the retired PEs' marker",
                   _wait_marker(gateway, old, {}, plan.late_seen, marker, timeout, steps, "order"),
                   limit=None)  # bounds itself, as the drain
    go = {m.src_worker for m in plan.moves}
    await asyncio.gather(*(gateway.handover_go(w, marker) for w in sorted(go)),
                         return_exceptions=True)     # a worker that did not hear it goes on after the bound
    if late:                    # their inputs from the retired PEs went dry: removed now, as the groups come
        await step("order: rewire in", _rewire_downstream(gateway, new, plan, steps, only=late, label="order: rewire in"))
    await _moves_done(gateway, plan, marker, timeout, steps)
    return pause


def _opens_early(plan: ReconfigurationPlan) -> bool:
    """May the created PEs be deployed and every new channel opened before the pause (``open``)?
    Where nothing retires (a Replicate): a created PE is then built from nothing the pause makes
    (no snapshot; its key groups come after the pause, ``go``), and no data reaches it
    or its channels until the upstream routers switch to them in the pause, so starting it early
    changes no tuple's path; the pause keeps only the switch (h30p: 44-143 ms of connects were in
    a loaded Replicate's pause)."""
    return bool(plan.created) and not plan.retired


def _created_states(old: Placement, new: Placement, states: dict[str, dict], plan: ReconfigurationPlan,
                    marker: str) -> dict[str, dict]:
    """The restore entries of the created PEs' operators: the retired ones' ``states`` re-split,
    and the key groups handed to them (``_awaited_moves``)."""
    out = redistribute(old, new, states, frozenset(m.op for m in plan.moves))
    out.update(_awaited_moves(plan, marker))
    return out


async def _open_early(gateway: WorkerGateway, new: Placement, plan: ReconfigurationPlan, worker_info: dict,
                      states: dict[str, dict], steps: dict) -> None:
    """Before the pause (``_opens_early``), one round in parallel: the created PEs built and started,
    their downstream PEs' new inputs registered, their upstream PEs' new outputs opened, none
    routed to; a channel to a receiver not there yet waits for it at its worker (PEHost._expect).
    The calls in the pause (``_rewire_downstream``, ``_rewire_upstream``) then switch to them."""
    calls = [_deploy_created(gateway, new, plan, worker_info, states, steps, label="open: deploy")]
    for pe_id, keys in plan.downstream_inputs.items():
        adds = [InputSpec(plan.channels[k], k[0], k[1]) for k in keys]
        calls.append(_timed(steps, f"open: in {pe_id}", gateway.rewire(
            new.pes[pe_id].worker, pe_id, add_inputs=cloudpickle.dumps(adds), early=True)))
    for pe_id, keys in plan.upstream_outputs.items():
        outs = [output_spec(new, worker_info, k, plan.channels[k]) for k in keys]
        calls.append(_timed(steps, f"open: out {pe_id}", gateway.rewire(
            new.pes[pe_id].worker, pe_id, outputs=cloudpickle.dumps(outs), early=True)))
    await asyncio.gather(*calls)


def _move(move: GroupMove, marker: str, timeout: float, ordered: bool = False) -> dict:
    """A group move as a worker takes it (plain data), tagged with the reconfiguration's marker.
    Its parts are packed and sent once the pause is over (``go``: the controller says so, or
    after ``timeout``): packing holds the GIL, and in the pause it kept the exporting worker's
    loop from the calls the pause waits for (the new channels' connects: 1-3 s at 10^6 keys).
    ``ordered``: its ``go`` follows an order wait, bounded on standing still, not on length."""
    return {**asdict(move), "tag": marker, "go": DRAIN_CAP * timeout if move.src_live or ordered else timeout}


async def _pause(gateway: WorkerGateway, old: Placement, plan: ReconfigurationPlan, by_worker: dict[str, dict],
                 marker: str, timeout: float, first: dict[str, dict]) -> None:
    """The pause calls, one per worker, each asked for the drain's first look on its worker as
    well (``_drain_wants``); ``first`` gets the answers of those that gave one (a worker of an
    older version, or a fake, answers nothing: the drain then asks it)."""
    wants = _drain_wants(old, plan)
    look = min(DRAIN_LOOK_S, 0.9 * timeout)

    async def pause(worker: str, todo: dict) -> None:
        drain = {**wants[worker], "timeout": look} if worker in wants else None
        answer = await gateway.pause(worker, marker, **todo, **({"drain": drain} if drain else {}))
        if isinstance(answer, dict) and drain:
            first[worker] = answer
    await asyncio.gather(*(pause(w, todo) for w, todo in by_worker.items()))


def _stopped_with_hand_over(old: Placement, plan: ReconfigurationPlan, leave_out: list[str]) -> set[str]:
    """Retired PEs that stop in the call that exports their key groups (``HandOvers.pe_handover``):
    those that export some (not ``src_live``) and have no operator left to snapshot (``_snapshot``
    does not ask them), so nothing comes between their hand-over and their stop (a Release's copy)."""
    exporting = {m.src_pe for m in plan.moves if not m.src_live}
    return {p for p in plan.retired if p in exporting and set(old.pes[p].operators) <= set(leave_out)}


def _snapshotted_with_hand_over(plan: ReconfigurationPlan, stopping: set[str]) -> set[str]:
    """Retired PEs that export key groups and have operators left to snapshot (a Move's PE):
    snapshotted and stopped in the call that exports their groups, right after the export
    (``HandOvers.pe_handover``), where the hand-over, the snapshot and the stop were three
    rounds of calls to their worker's loop in the pause."""
    exporting = {m.src_pe for m in plan.moves if not m.src_live}
    return {p for p in plan.retired if p in exporting and p not in stopping}


def _switch_with_hand_over(plan: ReconfigurationPlan, stopping: set[str]) -> str | None:
    """The one PE whose switch may go in the very round of the retired PEs' hand-over, carrying
    the gates of the groups coming back (``PEHost.pe_rewire``'s ``expect``: gated before its
    routers switch, in one call), or None. A Release of a copy whose original runs its router:
    the pause is then two rounds of calls (pause, then hand-over with the switch), not three.

    Only where nothing orders the two: nothing is created (no PE is built from a snapshot or a
    hand-over), every retired PE stops in its hand-over's call (``stopping``: none is
    snapshotted), every move goes to a running owner (its parts go at the ``go``, after
    the pause; none is imported before a switch), every gate is in that one PE and it is the only
    one that switches, and no PE downstream is rewired in the pause (``late_seen`` ones are, after).
    The retired copy is aligned then: it takes nothing more, and its input channel closing under
    it before its stop only ungates it (``FrameReceiver.connection_lost``)."""
    if plan.created or not plan.retired or set(plan.retired) - stopping or not plan.moves:
        return None
    if not all(m.dst_live and not m.src_live for m in plan.moves):
        return None
    gating = {m.dst_pe for m in plan.moves}
    switching = set(plan.hold) | set(plan.upstream_outputs) | set(plan.routing)
    downstream = (set(plan.seen) | set(plan.downstream_inputs) | set(plan.edges)) - set(plan.late_seen)
    if len(gating) != 1 or switching != gating or downstream:
        return None
    return next(iter(gating))


def _gates(plan: ReconfigurationPlan, marker: str, timeout: float) -> dict[str, list[dict]]:
    """Worker -> the moves to running owners there: the groups they gate."""
    gates: dict[str, list[dict]] = {}
    ordered = bool(plan.late_seen)          # the go comes after the order wait (_late_seen)
    for move in plan.moves:
        if move.dst_live:
            gates.setdefault(move.dst_worker, []).append(_move(move, marker, timeout, ordered))
    return gates


async def _hand_over_retired(gateway: WorkerGateway, plan: ReconfigurationPlan, marker: str, timeout: float,
                             stopping: set[str] = frozenset(), gate: bool = True, snapshot: set[str] = frozenset(),
                             leave_out: list[str] = ()) -> dict[str, dict]:
    """Key groups leave the aligned PEs going away, each straight to its new owner's worker. A
    running owner first gates them (their tuples wait there for their state, which comes after
    the routing switch).
    ``stopping``: retired PEs that stop in their worker's hand-over call, right after it.
    ``snapshot``: retired PEs snapshotted (but ``leave_out``'s operators) and then stopped in that
    call (``_snapshotted_with_hand_over``); their operators' states are answered, op_id -> saved
    state, as :func:`_snapshot` answers them.
    ``gate``: False where the gates go with the switch (``_switch_with_hand_over``)."""
    gates = _gates(plan, marker, timeout) if gate else {}
    ordered = bool(plan.late_seen)          # the go comes after the order wait (_late_seen)
    by_worker: dict[str, list[dict]] = {}
    for move in plan.moves:
        if not move.src_live:
            by_worker.setdefault(move.src_worker, []).append(_move(move, marker, timeout, ordered))
    # One round, both sides at once: a move's parts are sent only at the ``go`` (after
    # the pause), so its gate, set up by this very step, is in place before they come. In turn
    # they were two round trips to two busy worker loops, a Release's ``handover`` step.
    stop_at: dict[str, list[str]] = {}
    for move in plan.moves:
        if move.src_pe in stopping | snapshot and move.src_pe not in stop_at.get(move.src_worker, []):
            stop_at.setdefault(move.src_worker, []).append(move.src_pe)
    snap_at = {w: snapped for w, pes in stop_at.items() if (snapped := [p for p in pes if p in snapshot])}

    def asked(w: str) -> dict:
        return {**({"stop": stop_at[w]} if w in stop_at else {}),
                **({"snapshot": snap_at[w], "leave_out": list(leave_out)} if w in snap_at else {})}
    answers = await asyncio.gather(*(gateway.handover_expect(w, moves) for w, moves in gates.items()),
                                   *(gateway.handover(w, moves, **asked(w)) for w, moves in by_worker.items()))
    blobs = []
    for w, answer in zip(by_worker, answers[len(gates):]):
        if w not in snap_at:
            continue
        if not isinstance(answer, dict) or "snapshot" not in answer:     # never restore them from nothing
            raise ReconfigurationFailed(f"worker {w} answered no snapshot of {snap_at[w]} to its hand-over")
        blobs.append(answer["snapshot"])
    return _op_states(blobs)


async def _moves_done(gateway: WorkerGateway, plan: ReconfigurationPlan, marker: str, timeout: float,
                      steps: dict) -> None:
    """After the pause: until every move's groups are imported by their new owner.

    The Reconfigurer holds its lock meanwhile, so no checkpoint (whose snapshot would miss the
    groups on their way and the tuples they hold) and no other reconfiguration starts. ``steps``
    gets what was still moving when the pause ended and when the move completed. Bounded on
    standing still: it fails when no group came in for ``timeout`` or a part was lost.
    """
    workers = sorted({m.dst_worker for m in plan.moves})
    if not workers:
        return
    steps["moving: groups after the pause"] = sum(len(m.groups) for m in plan.moves)
    t, last = time.perf_counter(), None
    while True:
        answers = await asyncio.gather(*(gateway.handover_wait(w, marker, timeout) for w in workers))
        failed = [a["failed"] for a in answers if a["failed"]]
        pending = sum(a["pending"] for a in answers)
        if failed or (pending and pending == last):
            raise ReconfigurationFailed(f"key groups did not arrive ({pending} pending): {'; '.join(failed)}")
        if not pending:
            break
        last = pending
    steps["moving: bytes"] = sum(a["bytes"] for a in answers)
    steps["moving: tuples held"] = sum(a["buffered"] for a in answers)
    held = steps["moving: tuples held"]         # their mean wait, arrival to their group's import:
    steps["moving: mean wait of a tuple held ms"] = round(1000 * sum(a.get("waited_s", 0.0) for a in answers) / held, 3) \
        if held else 0.0
    steps["moving: tuples carried"] = sum(a.get("carried", 0) for a in answers)    # a copy's queued input (carry)
    steps["moving: most tuples held at once"] = max(a.get("peak", 0) for a in answers)   # bounded by state.hold
    steps["moving: longest import ms"] = round(1000 * max(a.get("longest_import_s", 0.0) for a in answers), 3)
    steps["moving: done ms after the pause"] = round((time.perf_counter() - t) * 1000, 3)
    steps["moving: done at"] = round(max(a["done_at"] for a in answers), 3)


def _awaited_moves(plan: ReconfigurationPlan, marker: str) -> dict[str, dict]:
    """Restore entries of new instances whose key groups are handed to them: their worker builds
    them at once, those groups gated until their parts come (``worker/pending_groups.awaited``)."""
    out: dict[str, dict] = {}
    for move in plan.moves:
        if not move.dst_live:
            out.setdefault(move.dst, {"handover": marker, "groups": []})["groups"] += list(move.groups)
    return out


DRAIN_LOOK_S = 1.0     # how often the controller looks at a drain that is not done (progress, timeline)
DRAIN_CAP = 10         # a drain still moving after this many times its bound fails anyway


async def _wait_drained(gateway: WorkerGateway, old, plan, marker, timeout, steps: dict | None = None,
                        first: dict[str, dict] | None = None, wall: float | None = None) -> None:
    """Until every retired PE aligned and every staying PE took the marker from the retired ones.

    The bound is on standing still, not on length: the drain fails when nothing
    ahead of the markers moved for ``timeout`` (a lost wake-up, a deadlock), not
    while the PEs still work through what was queued before them. That work is
    finite (retired PEs' sources are paused, their senders hold behind the
    marker) but it is done at whatever speed the CPU allows: with both cores
    saturated by other processes a window copy's drain took 9 s of steady
    progress and was reported as "did not drain" (issue 20). ``DRAIN_CAP`` times
    the bound is the end in any case (only a bug keeps work ahead of a marker growing).
    ``steps`` gets when, after the drain began, each PE aligned and each staying
    PE took the marker from each listed channel: where a slow drain went.

    From the channels of ``plan.late_seen`` the marker need only be queued at their PE (``...
    queued`` in ``steps``): it takes it after the pause (``execute``'s order wait).
    ``first``: the workers' answers to the first look, given with the pause (``_pause``).
    """
    late = plan.late_seen
    await _wait_marker(gateway, old, plan.retired, {p: cs for p, cs in plan.seen.items() if p not in late},
                       marker, timeout, steps, "drain", queued=late, first=first, wall=wall)


def _drain_wants(old: Placement, plan: ReconfigurationPlan) -> dict[str, dict]:
    """Worker -> what :func:`_wait_drained` asks it (``drain_status``'s ``aligned``, ``seen``, ``queued``)."""
    late = plan.late_seen
    return _wants(old, plan.retired, {p: cs for p, cs in plan.seen.items() if p not in late}, late)


def _wants(old: Placement, aligned, seen: dict[str, list[str]], queued: dict[str, list[str]] | None) -> dict[str, dict]:
    """Worker -> its PEs to have aligned, taken or queued the marker (``drain_status``'s arguments)."""
    workers: dict[str, dict] = {}
    for pe_id in aligned:
        workers.setdefault(old.pes[pe_id].worker, {"aligned": [], "seen": {}})["aligned"].append(pe_id)
    for pe_id, channels in seen.items():
        workers.setdefault(old.pes[pe_id].worker, {"aligned": [], "seen": {}})["seen"][pe_id] = channels
    for pe_id, channels in (queued or {}).items():       # asked only where there are (fakes, old workers)
        workers.setdefault(old.pes[pe_id].worker, {"aligned": [], "seen": {}}).setdefault("queued", {})[pe_id] = channels
    return workers


async def _wait_marker(gateway: WorkerGateway, old: Placement, aligned, seen: dict[str, list[str]], marker: str,
                       timeout: float, steps: dict | None, what: str,
                       queued: dict[str, list[str]] | None = None, first: dict[str, dict] | None = None,
                       wall: float | None = None) -> None:
    """Until the PEs in ``aligned`` aligned on ``marker``, each PE of ``seen`` took it from its
    listed channels and each PE of ``queued`` has it in its inbox from its listed ones, bounded on
    standing still (``_wait_drained``); ``steps`` get ``what`` and each PE's or channel's time
    (after ``wall``, by default now). ``first``: worker -> its answer to the first look, given
    already (by its pause call: ``_pause``); that worker is not asked again until the second."""
    workers = _wants(old, aligned, seen, queued)
    first = dict(first or {})
    loop = asyncio.get_running_loop()
    began, wall = loop.time(), time.time() if wall is None else wall
    last, moved_at = None, began

    async def look_at(worker: str, want: dict, look: float) -> dict:
        if worker in first:
            return first.pop(worker)
        return await gateway.drain_status(worker, marker, timeout=look, **want)
    while True:
        look = min(DRAIN_LOOK_S, 0.9 * timeout)
        try:
            answers = await asyncio.wait_for(asyncio.gather(*(
                look_at(w, want, look) for w, want in workers.items())), timeout + look)
        except asyncio.TimeoutError:
            raise ReconfigurationFailed(f"did not {what}: a worker did not answer within {timeout:.0f}s") from None
        failed = [f for a in answers for f in a["failed"]]
        missing = [m for a in answers for m in a["missing"]]
        for a in answers:
            for name, at in a.get("times", {}).items():
                if steps is not None:
                    steps[f"{what} {name}"] = round(max(at - wall, 0.0) * 1000, 1)
        if not failed and not missing:
            return
        now = loop.time()
        progress = [a.get("progress") for a in answers]
        if progress != last:
            last, moved_at = progress, now
        if failed or now - moved_at >= timeout or now - began >= DRAIN_CAP * timeout:
            report = await pe_report(gateway, old)
            raise ReconfigurationFailed(f"did not {what}: failed {failed}, still waiting for {missing} "
                                        f"(nothing moved for {now - moved_at:.1f}s, {now - began:.1f}s "
                                        f"in all); the PEs then:\n{report}")


async def pe_report(gateway: WorkerGateway, old: Placement) -> str:
    """One line per PE of ``old``: state, aligning, queue, full producers, and per output channel
    its credits, pending items, whether it is held, and its first items' kinds and flags
    (``ChannelOut.head``): why a drain did not finish, in one read."""
    try:
        answers = await asyncio.wait_for(gateway.stats(old.workers, dead_letters=False), 5)
    except Exception as exc:                   # the report must not hide the failure it explains
        return f"(no PE stats: {type(exc).__name__}: {exc})"
    lines = []
    for answer in answers:
        for pe_id, s in sorted(answer["pes"].items()):
            outs = " ".join(f"{c.split('/', 1)[-1]}[cr={o['credits']} pend={o['pending']}"
                            f"{' HELD' if o['held'] else ''}{' ' + o['head'] if o.get('head') else ''}]"
                            for c, o in s["channels_out"].items())
            ins = " ".join(f"{c.split('/', 1)[-1]}[{'END' if i.get('ended') else ''}"
                           f"{'M' if i.get('marked') else ''}]" for c, i in s["channels_in"].items())
            lines.append(f"  {pe_id}@{answer['worker']}: {s['state']} aligning={s['aligning']} "
                         f"queue={s['queue_batches']} full={s['full']} frozen={s.get('frozen')} "
                         f"threaded={s['threaded']}\n    in: {ins}\n    out: {outs}")
    return "\n".join(lines)


def _handed_over(old: Placement, plan: ReconfigurationPlan) -> list[str]:
    """Instances whose key groups moved worker to worker (``plan.moves``): ``redistribute`` leaves
    their snapshots out, so the retired PEs do not take them. A Release's copy on ``disk`` had its
    groups dropped by range, and reading which groups it still held visited every key dropped
    (a seek skips range-deleted keys one by one): 22-44 ms of the pause at 5 * 10^5 keys."""
    return sorted({inst for x in {m.op for m in plan.moves} for inst in old.instances(x)})


async def _snapshot(gateway: WorkerGateway, old, retired, leave_out: list[str] = ()) -> dict[str, dict]:
    """op_id -> saved state, gathered from every retired PE (but ``leave_out``'s operators). A PE
    whose every operator is left out (a Release's copy, all its groups handed over) is not asked:
    its answer would be empty, after a round trip to its worker's loop in the pause."""
    by_worker: dict[str, list[str]] = {}
    for pe_id in retired:
        if not set(old.pes[pe_id].operators) <= set(leave_out):
            by_worker.setdefault(old.pes[pe_id].worker, []).append(pe_id)
    blobs = await asyncio.gather(*(gateway.snapshot(w, p, leave_out) for w, p in by_worker.items()))
    return _op_states(blobs)


def _op_states(blobs) -> dict[str, dict]:
    """op_id -> saved state, from the workers' snapshot answers (``PEHost.pe_snapshot``'s:
    cloudpickled pe_id -> op_id -> state)."""
    states: dict[str, dict] = {}
    for blob in blobs:
        for pe_states in cloudpickle.loads(blob).values():
            states.update(pe_states)
    return states


_ASKED: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("asked")   # _wait_calls' calls out


async def _wait_calls(gateway: WorkerGateway, workers: list[str], calls: Callable[[], Awaitable], timeout: float,
                      steps: dict, what: str) -> Any:
    """Await ``calls()`` (whose worker calls go through :func:`_timed`), bounded on
    standing still as a drain is (``_wait_marker``): it fails when, for ``timeout``, no call
    answered and no open one passed a part on its worker (``PEHost.pe_calls``), or after
    ``DRAIN_CAP`` times the bound in any case. Under load a copy's deploy and its router's
    rewire passed 10 s with no word of where they were (the property test, disk window, load
    5-12); now ``steps`` get, for each call still open at the controller's last look, where it
    stood, and a failure says which calls on which worker it waited for and their parts."""
    asked: dict[str, float] = {}
    token = _ASKED.set(asked)
    try:
        task = asyncio.ensure_future(calls())        # made here, its tasks see ``asked`` (a context copy)
    finally:
        _ASKED.reset(token)
    loop = asyncio.get_running_loop()
    began = moved_at = loop.time()
    last = None
    try:
        while True:
            await asyncio.wait({task}, timeout=min(DRAIN_LOOK_S, 0.9 * timeout))
            if task.done():
                return task.result()
            now = loop.time()
            looks = await asyncio.gather(*(gateway.calls(w) for w in workers), return_exceptions=True)
            open_ = [(a["worker"], c) for a in looks if isinstance(a, dict) for c in a["calls"]]
            for worker, c in open_:
                steps[f"{what}: open {c['call']} on {worker}"] = round(sum(c["parts"].values()) + c["since_ms"], 1)
            progress = (frozenset(asked), sorted((w, c["call"], len(c["parts"])) for w, c in open_))
            if progress != last:
                last, moved_at = progress, now
            if now - moved_at >= timeout or now - began >= DRAIN_CAP * timeout:
                where = "; ".join(
                    f"{w}: {c['call']} after {list(c['parts'])[-1:] or ['its start']} for {c['since_ms']:.0f} ms"
                    for w, c in open_) or "none open on a worker (not begun, or answered and in transit)"
                opening = [o for a in looks if isinstance(a, dict) for o in a["opening"]]
                raise ReconfigurationFailed(
                    f"{what}: no answer from {sorted(asked)} (nothing moved for {now - moved_at:.1f}s, "
                    f"{now - began:.1f}s in all); calls open: {where}; channels still opening: {opening}")
    finally:
        if not task.done():                  # the step failed: its calls go with it
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _timed(steps: dict, label: str, call) -> Any:
    """Await one worker call; ``steps`` gets its milliseconds under ``label``, how long it waited
    before the handler ran (``queued``: transit and a busy worker loop) and the handler's parts
    (``pehost.Laps``) in the order they ran. While it is out, :func:`_wait_calls` knows it."""
    sent, t = time.time(), time.perf_counter()
    asked = _ASKED.get(None)
    if asked is not None:
        asked[label] = sent
    answer = await call
    if asked is not None:
        asked.pop(label, None)
    steps[label] = round((time.perf_counter() - t) * 1000, 3)
    if isinstance(answer, dict) and "ms" in answer:
        steps[f"{label}: queued"] = round(max(answer["began"] - sent, 0.0) * 1000, 3)
        steps.update({f"{label}: {part}": ms for part, ms in answer["ms"].items()})
    return answer


async def _rewire_downstream(gateway: WorkerGateway, new, plan, steps, skip: set[str] = frozenset(),
                             only: set[str] | None = None, label: str = "rewire in") -> None:
    """Staying PEs' new inputs registered, their inputs from retired PEs removed, their edges set:
    all but ``skip``'s (or only ``only``'s: ``plan.late_seen``'s, once they took the marker)."""
    calls = []
    for pe_id in set(plan.seen) | set(plan.downstream_inputs) | set(plan.edges):
        if pe_id in skip or (only is not None and pe_id not in only):
            continue
        adds = [InputSpec(plan.channels[k], k[0], k[1]) for k in plan.downstream_inputs.get(pe_id, [])]
        edges = cloudpickle.dumps(plan.edges[pe_id]) if pe_id in plan.edges else b""
        calls.append(_timed(steps, f"{label} {pe_id}", gateway.rewire(
            new.pes[pe_id].worker, pe_id, add_inputs=cloudpickle.dumps(adds),
            remove_inputs=plan.seen.get(pe_id, []), edges=edges, copies=copy_map(new))))
    await asyncio.gather(*calls)


async def _deploy_created(gateway: WorkerGateway, new, plan, worker_info, states, steps,
                          label: str = "deploy") -> None:
    """Build the created PEs, restored from ``states``, and start them (``steps``: ``label`` and their ids)."""
    specs = build_specs(new, worker_info, gateway.deployment, plan.channels, plan.created, plan.epoch)
    by_worker: dict[str, list] = {}
    for pe_id, spec in specs.items():
        spec.restore = {op: states[op] for op in new.pes[pe_id].operators if op in states}
        by_worker.setdefault(new.pes[pe_id].worker, []).append(spec)
    await asyncio.gather(*(_timed(steps, f"{label} {','.join(x.pe_id for x in s)}", gateway.deploy(w, s))
                           for w, s in by_worker.items()))


async def _rewire_upstream(gateway: WorkerGateway, new, plan, worker_info, steps, marker: str, timeout: float,
                           gating: dict[str, list[dict]] | None = None) -> None:
    """Staying PEs' outputs re-pointed and routers switched; an instance there that gives key
    groups away exports them in the same turn (``handover``). ``gating``: PE -> moves
    whose groups its instances gate in the same call, before its routers switch."""
    gating = gating or {}
    calls = []
    exports: dict[str, list[dict]] = {}
    for move in plan.moves:
        if move.src_live:
            exports.setdefault(move.src_pe, []).append(_move(move, marker, timeout))
    for pe_id in set(plan.hold) | set(plan.upstream_outputs) | set(plan.routing) | set(exports):
        outs = [output_spec(new, worker_info, k, plan.channels[k]) for k in plan.upstream_outputs.get(pe_id, [])]
        routing = cloudpickle.dumps(plan.routing[pe_id]) if pe_id in plan.routing else b""
        calls.append(_timed(steps, f"rewire out {pe_id}", gateway.rewire(
            new.pes[pe_id].worker, pe_id, outputs=cloudpickle.dumps(outs),
            remove_outputs=plan.hold.get(pe_id, []), routing=routing, copies=copy_map(new),
            handover=exports.get(pe_id, []), **({"expect": gating[pe_id]} if pe_id in gating else {}))))
    await asyncio.gather(*calls)

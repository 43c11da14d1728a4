"""The Reconfigurer: the only writer of a deployment's placement, channels and epoch.

Everything that changes the layout goes through here, under one lock
(:attr:`Reconfigurer.lock`):

* :meth:`Reconfigurer.launch`: the first placement is deployed;
* :meth:`Reconfigurer.apply`: an action (Fuse, Split, Move, Replicate,
  Release; BorrowHosts/ReturnHost are handed to the host manager) becomes a
  new placement (``plan/transforms.py``), a reconfiguration plan and the
  protocol that runs it (``protocol.py``), and an :class:`ApplyRecord`.
  When no warm slot is left it starts a worker on the embedded cluster first
  (the cold start) and places there;
* :meth:`Reconfigurer.add_workers` / :meth:`remove_workers`: borrowed hosts
  join and leave (``hosts.py``).

The lock is the one a checkpoint coordinator must take too: checkpoints and
reconfigurations never interleave (a barrier crossing a half-rewired graph
would snapshot a state no placement had). A checkpoint's write to storage comes
after the lock (:meth:`Reconfigurer.writing`); a reconfiguration that pauses
waits for it to end before its pause (bounded): the workers' writers held the GIL
against the very loops the pause's calls wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import AsyncIterator, Awaitable, Callable

from ..actions import Action, ActionRefused, BorrowHosts, Replicate, ReturnHost
from ..plan.placement import Placement
from ..plan.transforms import NoSlotLeft, add_slot, add_workers, remove_workers, transform, with_slots
from ..plan.wiring import build_specs, channel_ids
from .cluster import EmbeddedCluster
from .gateway import WorkerGateway
from .protocol import ApplyRecord, execute, plan_reconfiguration
from .state import DeploymentState

logger = logging.getLogger(__name__)

HostActions = Callable[[Action, float], Awaitable[ApplyRecord]]


class LayoutLock(asyncio.Lock):
    """The reconfiguration lock (:attr:`Reconfigurer.lock`; FIFO, as asyncio's), taken with
    :meth:`held`, which says who holds it: an action that waited for it names what it waited behind
    in its record's steps (``"lock: checkpoint 12"``). A Replicate's 12-14 s in its ``plan`` step, beside
    a loaded suite, was the dashboard's import (session 81); nothing said so."""

    holder: str | None = None

    @contextlib.asynccontextmanager
    async def held(self, by: str) -> AsyncIterator[None]:
        async with self:
            self.holder = by
            try:
                yield
            finally:
                self.holder = None


class Reconfigurer:
    """Holds the placement (once), the channels and the epoch; applies every change to them."""

    def __init__(self, gateway: WorkerGateway, state: DeploymentState, deployment: str,
                 cluster: EmbeddedCluster | None, slots_per_host: int) -> None:
        self.gateway = gateway
        self.state = state
        self.deployment = deployment
        self.cluster = cluster
        self.slots_per_host = slots_per_host
        self.placement: Placement | None = None
        self.channels: dict = {}
        self.epoch = 0
        self.worker_info: dict[str, dict] = {}
        self.records: list[ApplyRecord] = []
        self.lock = LayoutLock()                    # reconfigurations and checkpoints take it
        self.host_actions: HostActions | None = None      # the host manager's apply, for Borrow/Return
        self.on_worker: Callable[[str], None] = lambda worker: None      # a worker joined: watch it
        self.on_failure: Callable[[str], Awaitable[None]]     # the protocol failed half-way: fail the run
        self.last_cold_start_s: float | None = None
        self.activating: dict[str, float] = {}     # copy PE -> when its Replicate was decided (time.time())
        self.activations: dict[str, float] = {}    # copy PE -> ms from the decision to its first batch
        self.on_activation: Callable[[str, float], None] = lambda copy, ms: None
        # PE -> its lazy restore's progress (None: not reported yet) while its key groups load:
        # a rescale of it is refused until they are in (worker/lazy_restore.py)
        self.restoring: dict[str, dict | None] = {}
        self.lost: Callable[[], set[str]] = set     # workers known lost (a recovery's): never grown beside
        self.applying: tuple[str, float] | None = None    # the action being applied and since when (time.time())
        self.writes = 0                             # checkpoint writes to storage in flight (writing)
        self._written = asyncio.Condition()

    # -- the first placement ----------------------------------------------------------------
    async def known_workers(self) -> list[str]:
        """Every worker in the cluster, its PE host's answer kept in :attr:`worker_info`."""
        info = await self.gateway.workers()
        addresses = sorted(info)
        answers = await asyncio.gather(*(self.gateway.pe_info(w) for w in addresses))
        for address, answer in zip(addresses, answers):
            self.know(address, answer, info[address].get("host", ""))
        return addresses

    def know(self, worker: str, answer: dict, host: str) -> None:
        """``worker``'s PE host answered ``answer`` (``pe_info``) on ``host``: what specs are built with."""
        self.worker_info[worker] = {**answer, "host": host}

    async def launch(self, placement: Placement, restore: dict[str, dict] | None = None) -> None:
        """Deploy ``placement``: every PE started (``restore``: op_id -> saved state, from a
        checkpoint), every standard slot warm."""
        async with self.lock.held("the launch"):
            await self.relaunch(placement, restore)

    async def restart(self, placement: Placement, restore: dict[str, dict]) -> None:
        """A recovery's launch (its caller holds :attr:`lock`, the old PEs stopped): a new epoch,
        so the old PEs' channels and checkpoint barriers are stale to the new ones."""
        self.epoch += 1
        await self.relaunch(placement, restore)

    async def relaunch(self, placement: Placement, restore: dict[str, dict] | None = None) -> None:
        """:meth:`launch` for a caller already holding :attr:`lock` (a recovery, whose old PEs are
        stopped): channels of a new epoch, so nothing of the old wiring is taken for new."""
        self.channels = channel_ids(placement, self.deployment, self.epoch)
        specs = build_specs(placement, self.worker_info, self.deployment, self.channels, epoch=self.epoch)
        for pe_id, spec in specs.items():
            spec.restore = {op: restore[op] for op in placement.pes[pe_id].operators if op in (restore or {})}
        self.restoring = {pe_id: None for pe_id in await self.gateway.launch(specs, placement) or ()}
        self.placement = placement
        await self._warm(placement)

    async def _warm(self, placement: Placement) -> None:
        per_worker: dict[str, int] = {}
        for slot in placement.slots.values():
            per_worker[slot.worker] = per_worker.get(slot.worker, 0) + 1
        await self.gateway.warm(per_worker)

    # -- actions -----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        """A checkpoint's write to storage, which runs after the coordinator released :attr:`lock`:
        a reconfiguration that pauses waits for it to end first (:meth:`_after_writes`). Traced at
        10^6 and 10^7 keys on memory, the checkpoint right after a Replicate (it writes the moved
        groups whole) was still writing through the next Release's pause: the workers' writer
        threads (the fold, ``pack_group``: 250-280 ms of Python each at 10^7) held the GIL against
        the worker loops each of the pause's calls waits for. Not around the checkpoint's
        completion, which takes the lock again."""
        self.writes += 1
        try:
            yield
        finally:
            self.writes -= 1
            async with self._written:
                self._written.notify_all()

    async def _after_writes(self, timeout: float) -> float | None:
        """Until no checkpoint write is in flight (:meth:`writing`), at most ``timeout`` (then the
        pause goes on beside it); the milliseconds waited, or None when none was. :meth:`apply`
        gives it half the action's timeout, and the pause what is left: the action ends within it."""
        if not self.writes:
            return None
        t = time.perf_counter()
        async with self._written:
            try:
                await asyncio.wait_for(self._written.wait_for(lambda: not self.writes), timeout)
            except asyncio.TimeoutError:
                logger.warning("a checkpoint write still runs after %.0f s: the pause goes on beside it", timeout)
        return round((time.perf_counter() - t) * 1000, 3)

    async def apply(self, action: Action, timeout: float) -> ApplyRecord:
        """Apply ``action``; refused (with the reason) when impossible, recorded either way."""
        if isinstance(action, (BorrowHosts, ReturnHost)):
            if self.host_actions is None:
                return self.record(ApplyRecord(action, False, "no host manager"))
            return self.record(await self.host_actions(action, timeout))
        decided, t0, behind = time.time(), time.perf_counter(), self.lock.holder
        self.applying = mine = (repr(action), decided)
        try:
            return await self._apply(action, timeout, decided, t0, behind)
        finally:
            if self.applying is mine:       # a second action asked meanwhile (it waits for this one) stays shown
                self.applying = None

    def in_flight(self) -> dict | None:
        """The status's ``reconfiguring``: the action being applied, for how long, and what holds the
        lock it waits for (None once it holds it)."""
        if self.applying is None:
            return None
        action, since = self.applying
        holder = self.lock.holder
        return {"action": action, "age_s": round(time.time() - since, 1),
                "waits_for": holder if holder is not None and holder != action else None}

    async def _apply(self, action: Action, timeout: float, decided: float, t0: float, behind: str | None) -> ApplyRecord:
        async with self.lock.held(repr(action)):
            steps = {f"lock: {behind}" if behind else "lock": round((time.perf_counter() - t0) * 1000, 3)}
            t0 = time.perf_counter()
            try:
                old, new, plan = await self._planned(action)
            except ActionRefused as exc:
                return self.record(ApplyRecord(action, False, str(exc)))
            steps["plan"] = round((time.perf_counter() - t0) * 1000, 3)
            if plan.retired or plan.hold:          # it pauses: not beside a checkpoint's writers
                waited = await self._after_writes(timeout / 2)   # the other half is the pause's
                if waited is not None:
                    steps["before the pause: checkpoint write"] = waited
                    timeout -= waited / 1000
            record = self.record(await self._run(action, old, new, plan, timeout, steps))
        if record.applied:          # a copy retired before its first batch was seen has no figure
            self.activating = {p: t for p, t in self.activating.items() if p not in record.retired}
            if isinstance(action, Replicate):
                self.activating.update({p: decided for p in record.created if new.pes[p].copy_of})
        return record

    def activated(self, answers: list[dict]) -> dict[str, float]:
        """Copies whose first batch the workers' ``answers`` report: ``{copy: ms}`` from the
        decision (``apply`` called) to that batch, kept in :attr:`activations` and reported."""
        seen = {}
        for answer in answers:
            for pe_id, stats in answer["pes"].items():
                first = stats.get("first_input_at")
                if first and pe_id in self.activating:
                    seen[pe_id] = self.activations[pe_id] = (first - self.activating.pop(pe_id)) * 1000
                    self.state.event("activation", f"copy {pe_id} processed its first batch "
                                                   f"{seen[pe_id]:.0f} ms after the decision")
                    self.on_activation(pe_id, seen[pe_id])
        return seen

    def restoring_view(self) -> dict[str, dict]:
        """The status's ``checkpoints.restoring``: each restored PE whose key groups still load and
        how far (its figures: ``groups``, ``loaded``, ``s`` since it started; ``{}`` until its
        worker first reports). At 10^7 keys the load takes tens of seconds after the first output."""
        return {pe_id: dict(figures or {}) for pe_id, figures in sorted(self.restoring.items())}

    def loaded(self, answers: list[dict]) -> None:
        """The workers' ``answers``: how far each restored PE's key groups are; a running PE that
        reports none loading has them all (its figures carry ``restoring`` until then), and one
        that ended (finished, failed) loads none any more."""
        for answer in answers:
            for pe_id, stats in answer["pes"].items():
                if pe_id not in self.restoring:
                    continue
                if stats.get("restoring"):
                    self.restoring[pe_id] = stats["restoring"]
                elif stats.get("state") == "running":
                    del self.restoring[pe_id]
                    files = stats.get("restored_files")
                    self.state.event("restored", f"PE {pe_id} has loaded every key group of its restore"
                                     + (f" ({files[0]} files read from its worker's copies, {files[1]} from the "
                                        f"storage)" if files else ""))
                elif stats.get("state") not in (None, "created"):
                    del self.restoring[pe_id]

    async def _still_restoring(self, plan, placement: Placement) -> None:
        """Refuse a plan that snapshots or exports from a PE whose restored key groups still load
        (the worker would refuse it half-way, ``StillLoading``, and fail the deployment): before
        the pause, the stream undisturbed, with how far the load is; a policy tries again later.
        Their workers are asked first (the figures the monitor last took may be a round old)."""
        touched = {*plan.retired, *(m.src_pe for m in plan.moves)}
        if not touched & set(self.restoring):
            return
        workers = sorted({placement.pes[p].worker for p in touched & set(self.restoring)})
        try:
            self.loaded(await self.gateway.stats(workers, dead_letters=False))
        except Exception as exc:        # a lost worker: its recovery comes; the last figures stand
            logger.debug("restoring figures of %s: %s", workers, exc)
        for pe_id in sorted(p for p in touched if p in self.restoring):
            done = self.restoring[pe_id]
            far = (f"{done['loaded']} of {done['groups']} loaded after {done['s']:.1f} s" if done
                   else "its first figures not in yet")
            raise ActionRefused(f"PE {pe_id!r} is still loading the key groups of its restore ({far}); "
                                f"its state moves once they are all in: try again then")

    async def _planned(self, action: Action):
        """The placement now, the one ``action`` makes and the plan between them (a cold start
        first when no warm slot is left); raises :class:`ActionRefused`."""
        if not self.state.live:
            raise ActionRefused(f"the deployment is {self.state.state}")
        try:
            new = transform(self.placement, action)
        except NoSlotLeft as exc:
            new = transform(await self._cold_slot(action, exc), action)
        old = self.placement
        plan = plan_reconfiguration(old, new, self.channels, self.deployment, self.epoch + 1)
        done = self.state.done_pes(plan.retired)
        if done:
            raise ActionRefused(f"PE {done[0]!r} is {self.state.pe_state.get(done[0])}: nothing to move")
        await self._still_restoring(plan, old)
        return old, new, plan

    async def _run(self, action: Action, old: Placement, new: Placement, plan, timeout: float,
                   steps: dict[str, float] | None = None) -> ApplyRecord:
        self.epoch += 1
        steps = {} if steps is None else steps
        try:
            pause = await execute(self.gateway, old, new, plan, self.worker_info,
                                  f"{self.deployment}/reconf/{self.epoch}", timeout, steps)
        except Exception as exc:
            logger.error("reconfiguration %r failed", action, exc_info=True)
            await self.on_failure(f"reconfiguration {action!r} failed: {type(exc).__name__}: {exc}")
            return ApplyRecord(action, False, f"failed: {exc}", steps=steps)
        self.placement, self.channels = new, plan.channels
        self.state.pes_replaced(new.pes)
        moved = {op: (old.pe_of(op), new.pe_of(op)) for op in new.plan.ops if op in old.plan.ops
                 and (old.pe_of(op), old.pes[old.pe_of(op)].worker) != (new.pe_of(op), new.pes[new.pe_of(op)].worker)}
        return ApplyRecord(action, True, getattr(action, "reason", ""), pause * 1000,
                           plan.retired, plan.created, moved, steps=steps)

    async def _cold_slot(self, action: Action, exc: NoSlotLeft) -> Placement:
        """No warm slot is left: start a new worker (a cold start) with one slot.

        Only an embedded cluster can grow this way; on another cluster the
        action is refused (borrow a host instead). The record's ``cold``
        figure says how long the worker took to start. Only the new worker is
        called: a worker of the placement that is lost (SIGKILLed a moment ago,
        its recovery pending) refuses the action at once, before and after the
        start, instead of a call to its address waiting out Dask's 30 s connect timeout.
        """
        if self.cluster is None:
            raise ActionRefused(f"{exc} and the cluster is not ours to grow: borrow a host (BorrowHosts) first")
        await self._none_lost(action)
        t0 = time.perf_counter()
        before = set(self.placement.workers)
        await self.cluster.grow(self.gateway.client)
        info = await self.gateway.workers()
        joined = sorted(w for w in info if w not in before and w not in self.lost())
        if not joined:
            raise ActionRefused(f"{exc}; starting a new worker failed")
        await self._none_lost(action, info)
        worker = joined[0]
        self.know(worker, await self.gateway.pe_info(worker), info[worker].get("host", ""))
        grown = add_slot(add_workers(self.placement, {worker: self.worker_info[worker]["host"]}), worker)
        self.placement = grown
        await self.gateway.warm({worker: 1})       # the others' slots are warm already
        self.on_worker(worker)
        self.last_cold_start_s = time.perf_counter() - t0
        self.state.event("cold-start", f"no warm slot for {action!r}: started worker {worker} "
                                       f"in {self.last_cold_start_s:.2f} s")
        return grown

    async def _none_lost(self, action: Action, listed: dict | None = None) -> None:
        """Refuse ``action`` while a worker running a PE is lost (``lost``, or gone from the
        scheduler's list ``listed``, asked when not given): the run restores its last checkpoint
        onto the workers left (or fails), so nothing is started or moved beside it meanwhile."""
        listed = await self.gateway.workers() if listed is None else listed
        known = self.lost()
        lost = sorted(w for w in self.running_on() if w in known or w not in listed)
        if lost:
            why = "its recovery restores the last checkpoint" if lost[0] in known else "gone from the scheduler"
            raise ActionRefused(f"worker {lost[0]} is lost ({why}); no worker is started beside it for "
                                f"{action!r}: try again once the restore is done")

    def record(self, record: ApplyRecord) -> ApplyRecord:
        """Keep ``record`` (``Deployment.records()``) and say what happened in the events."""
        self.records.append(record)
        if record.applied:
            self.state.event("reconfigure", f"{record.action!r}: {len(record.moved)} operators moved, "
                                            f"pause {record.pause_ms:.1f} ms")
        else:
            self.state.event("refused", f"{record.action!r}: {record.reason}")
        return record

    # -- the worker set (hosts.py borrows and returns hosts) --------------------------------
    async def add_workers(self, host_id: str, infos: dict[str, dict]) -> None:
        """Workers of ``host_id`` (their ``pe_info`` answers) join the placement, slots warmed."""
        async with self.lock.held(f"host {host_id} joining"):
            for worker, info in infos.items():
                self.know(worker, info, host_id)
            grown = add_workers(self.placement, dict.fromkeys(infos, host_id))
            self.placement = with_slots(grown, self.slots_per_host)
        await self._warm(self.placement)

    async def remove_workers(self, workers: set[str]) -> None:
        """``workers`` leave the placement: nothing new is placed there (their PEs move separately)."""
        async with self.lock.held(f"{len(workers)} workers leaving"):
            self.placement = remove_workers(self.placement, workers)

    def running_on(self) -> list[str]:
        """Workers of the placement plus any still running a PE (a host being given back has
        left ``workers`` while its PEs move off)."""
        pl = self.placement
        if pl is None:
            return []
        return list(dict.fromkeys(list(pl.workers) + [pe.worker for pe in pl.pes.values()]))

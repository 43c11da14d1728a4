"""The deployment's side of resource management: borrowed hosts join, leave, or are lost.

:class:`HostManager` is owned by a deployment and works on it through the
small :class:`Fleet` protocol (the deployment's Reconfigurer, watchers and
state), so it is tested with a fake of a few lines. It starts the resource manager (in the background: an app never waits for, or
stops because of, a resource manager that is slow, unreachable or refusing;
it runs on what it holds), keeps the :class:`ResourceView` policies see, and
turns the manager's events and the ``BorrowHosts``/``ReturnHost`` actions into
changes of the placement's worker set:

* a granted host's workers join the placement (the PE host plug-in is already
  installed on late joiners by Dask), and are watched like the first ones;
* a host to give back is *fenced* first (nothing new is placed on it), its PEs
  leave by ``Move`` actions through the one reconfiguration protocol, then its
  workers leave the placement and the manager gets it back, before the
  deadline or with a status event saying by how much and why it was missed;
* a lost host is a clear error in the status events; if PEs ran there, the
  deployment restores its last checkpoint onto the hosts left (control/
  recovery.py), or fails naming the host when checkpoints are off.

Every step is recorded in :attr:`HostManager.timeline` (monotonic times), which
the benchmark reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Mapping, Protocol

from .. import config
from ..actions import Action, BorrowHosts, Move, ReturnHost
from ..errors import InvalidApplication
from ..plan.placement import Placement
from .protocol import ApplyRecord
from ..resources import (Host, HostAvailable, HostLost, HostReturnRequested, ResourceView,
                        ReturnRequest)
from ..plan.transforms import least_loaded

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 30.0       # a granted worker's PE host must answer within this


class Fleet(Protocol):
    """What the host manager needs of a deployment: its layout (read, and changed only through
    the Reconfigurer), its watchers, and where to report."""

    def placement(self) -> Placement: ...
    def running(self, pe_id: str) -> bool: ...
    async def apply(self, action: Action, timeout: float) -> ApplyRecord: ...
    async def add_workers(self, host_id: str, infos: dict[str, dict]) -> None: ...
    async def remove_workers(self, workers: set[str]) -> None: ...
    async def watch(self, worker: str, on_lost: Callable[[str, Exception], Awaitable[None]]) -> None: ...
    async def pe_info(self, worker: str) -> dict: ...
    def record(self, record: ApplyRecord) -> ApplyRecord: ...
    def event(self, kind: str, text: str) -> None: ...
    async def fail(self, reason: str) -> None: ...


class HostManager:
    """Borrowed hosts of one deployment; see the module docstring."""

    def __init__(self, fleet: Fleet, rm_name: str | None) -> None:
        self.fleet = fleet
        self.rm_name = rm_name
        self.managers: Mapping[str, type] = {}
        self.scheduler_address = ""
        self.security = None
        self.rm = None
        self.error = ""                                   # why there is no resource manager
        self.borrowed: dict[str, Host] = {}
        self.returns: dict[str, ReturnRequest] = {}
        self.timeline: list[dict] = []
        self._watchers: dict[str, asyncio.Task] = {}
        self._returning: dict[str, asyncio.Task] = {}
        self._starting: asyncio.Task | None = None
        self._leaving: set[str] = set()                   # hosts being given back now
        self._losing: set[str] = set()                    # hosts lost, their workers leaving the placement
        self._asked_early: dict[str, HostReturnRequested] = {}  # asked back before they were adopted
        self._infos: dict[str, dict[str, dict]] = {}      # host -> its workers' pe_info answers

    # -- lifecycle ------------------------------------------------------------------------
    def check(self, managers: Mapping[str, type]) -> None:
        """Refuse an unknown resource manager name before anything starts (a user mistake);
        ``managers``: the installed ones, by name."""
        self.managers = managers
        if self.rm_name and self.rm_name not in managers:
            known = ", ".join(sorted(managers)) or "(none)"
            raise InvalidApplication(f"unknown resource manager {self.rm_name!r}. Known: {known}. "
                                     f"Register one with a pescheduler_resource_managers() hook.")

    def start(self, scheduler_address: str, security=None) -> None:
        """Start the resource manager in the background; the app does not wait for it.
        ``security``: the cluster's ``distributed.Security`` (TLS), passed on to the manager."""
        self.check(self.managers)
        self.scheduler_address, self.security = scheduler_address, security
        if self.rm_name:
            self._starting = asyncio.create_task(self._start_rm())

    async def _start_rm(self) -> None:
        cls = self.managers[self.rm_name]
        settings = config.section(f"rm.{self.rm_name}")
        rm = None
        try:
            # a bad setting fails here: reported, not lost
            rm = cls(self.scheduler_address, settings, **({"security": self.security} if self.security else {}))
            await asyncio.wait_for(rm.start(self._on_event), config.get_seconds("rm.start-timeout"))
        except Exception as exc:
            self.error = f"resource manager {self.rm_name!r} unavailable: {type(exc).__name__}: {exc}"
            self._event("rm-unavailable", self.error + "; running on the hosts held")
            if rm is not None:
                await self._close_quietly(rm)
            return
        self.rm = rm
        self._event("rm", f"resource manager {self.rm_name!r} ready ({rm.lendable()} hosts lendable)")

    async def ready(self, timeout: float) -> bool:
        """Wait (bounded) until the resource manager has started or failed; True if usable."""
        if self._starting is not None:
            await asyncio.wait_for(asyncio.shield(self._starting), timeout)
        return self.rm is not None

    async def close(self) -> None:
        """Stop watching, give every borrowed host back, close the resource manager."""
        tasks = [t for t in (self._starting, *self._returning.values(), *self._watchers.values()) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.rm is not None:
            await self._close_quietly(self.rm)
            self.rm = None

    async def _close_quietly(self, rm) -> None:
        try:
            await asyncio.wait_for(rm.close(), 120)
        except Exception as exc:
            logger.warning("closing resource manager %s failed: %s", self.rm_name, exc)

    def view(self) -> ResourceView:
        """What policies see: hosts held and borrowed, how many more could be had, returns due."""
        placement = self.fleet.placement()
        held = tuple(sorted(set(placement.hosts.values()))) if placement else ()
        return ResourceView(held=held, borrowed=tuple(self.borrowed),
                            lendable=self.rm.lendable() if self.rm else 0,
                            pending_returns=tuple(self.returns.values()),
                            manager=self.rm_name or "none",
                            budget=getattr(self.rm, "host_budget", dict)() if self.rm else {})

    # -- actions ----------------------------------------------------------------------------
    async def apply(self, action, timeout: float) -> ApplyRecord:
        """``BorrowHosts`` or ``ReturnHost`` (the Reconfigurer records the outcome like every action's)."""
        if isinstance(action, BorrowHosts):
            return await self._borrow(action, timeout)
        return await self.give_back(action.host, time.time() + timeout, action)

    async def _borrow(self, action: BorrowHosts, timeout: float) -> ApplyRecord:
        try:
            usable = await self.ready(timeout)
        except asyncio.TimeoutError:
            return ApplyRecord(action, False, f"resource manager {self.rm_name!r} is still starting")
        if not usable:
            self._mark("refused", "", reason=self.error or "no resource manager")
            return ApplyRecord(action, False, self.error or "no resource manager (deploy with rm=...)")
        t0 = time.monotonic()
        try:
            granted = await asyncio.wait_for(self.rm.request_hosts(action.n), timeout)
        except Exception as exc:
            self._mark("refused", "", t0=t0, reason=f"{type(exc).__name__}: {exc}")
            return ApplyRecord(action, False, f"resource manager failed: {type(exc).__name__}: {exc}")
        adopted = [h.host_id for h in granted if await self.adopt(h)]
        if not adopted:
            self._mark("refused", "", t0=t0, reason=f"granted none of {action.n}")
            return ApplyRecord(action, False, f"{self.rm_name} granted no host "
                                              f"({self.rm.lendable()} lendable now)")
        self._mark("borrowed", ",".join(adopted), t0=t0)
        return ApplyRecord(action, True, f"{action.reason}; got {', '.join(adopted)} in "
                                         f"{time.monotonic() - t0:.1f} s".lstrip("; "))

    async def adopt(self, host: Host) -> bool:
        """A granted host's workers join the placement; False (host given back) if they do not answer."""
        if host.host_id in self.borrowed:
            return True
        try:
            infos = await asyncio.gather(*(self._pe_info(w) for w in host.workers))
        except Exception as exc:
            self._event("host", f"host {host.host_id} joined but its workers do not answer ({exc}); giving it back")
            self._asked_early.pop(host.host_id, None)
            await self.rm.return_host(host)
            return False
        self.borrowed[host.host_id] = host
        self._infos[host.host_id] = dict(zip(host.workers, infos))
        await self.fleet.add_workers(host.host_id, self._infos[host.host_id])
        for w in host.workers:
            self._watchers[w] = asyncio.create_task(self._watch(w, host.host_id))
        self._event("host", f"borrowed {host.host_id}: workers {', '.join(host.workers)}")
        early = self._asked_early.pop(host.host_id, None)
        if early is not None:
            self._return_requested(early)
        return True

    async def _pe_info(self, worker: str) -> dict:
        """The worker's PE host answer; retried while the plug-in is being installed on it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + JOIN_TIMEOUT_S
        while True:
            try:
                return await self.fleet.pe_info(worker)
            except Exception:
                if loop.time() >= deadline:
                    raise
            await asyncio.sleep(0.05)        # polling: no event says "the plug-in is installed"

    # -- giving a host back -------------------------------------------------------------------
    async def give_back(self, host_id: str, deadline: float, action=None) -> ApplyRecord:
        """Fence the host, move its PEs away, take its workers out, return it to the manager."""
        action = action or ReturnHost(host_id)
        host = self.borrowed.get(host_id)
        if host is None:
            return ApplyRecord(action, False, f"host {host_id!r} was not borrowed "
                                              f"(borrowed: {', '.join(self.borrowed) or 'none'})")
        if host_id in self._losing:
            return ApplyRecord(action, False, f"{host_id} was lost: its workers are leaving the placement")
        if host_id in self._leaving:
            return ApplyRecord(action, False, f"{host_id} is being returned already")
        if not [w for w in self.fleet.placement().workers if w not in host.workers]:
            return ApplyRecord(action, False, f"cannot return {host_id}: no other worker would be left")
        self._leaving.add(host_id)
        try:
            return await self._evacuate_and_return(host, deadline, action)
        finally:
            self._leaving.discard(host_id)

    async def _evacuate_and_return(self, host: Host, deadline: float, action) -> ApplyRecord:
        host_id, t0, leaving = host.host_id, time.monotonic(), set(host.workers)
        await self.fleet.remove_workers(leaving)          # fence: nothing new lands there
        pause = 0.0
        while True:
            on_host = [p for p, pe in self.fleet.placement().pes.items()        # a finished PE has
                       if pe.worker in leaving and self.fleet.running(p)]       # nothing to move
            if not on_host:
                break
            target = least_loaded(self.fleet.placement())      # fenced workers are not candidates
            remaining = max(1.0, deadline - time.time())
            record = await self.fleet.apply(Move(on_host[0], target, reason=f"return host {host_id}"), remaining)
            if not record.applied:
                await self.fleet.add_workers(host_id, self._infos[host_id])
                return ApplyRecord(action, False, f"cannot return {host_id}: moving {on_host[0]} "
                                                  f"was refused: {record.reason}")
            pause += record.pause_ms
        self._stop_watching(host.workers)
        self.borrowed.pop(host_id, None)
        self._infos.pop(host_id, None)
        await self.rm.return_host(host)
        self.returns.pop(host_id, None)
        late = time.time() - deadline
        self._mark("returned", host_id, t0=t0, late_s=late)
        verdict = f"{late:.1f} s AFTER its deadline" if late > 0 else f"{-late:.1f} s before its deadline"
        self._event("host", f"returned {host_id} in {time.monotonic() - t0:.2f} s, {verdict}")
        return ApplyRecord(action, True, f"{getattr(action, 'reason', '')}; returned {host_id}, "
                                         f"{verdict}".lstrip("; "), pause)

    # -- events from the resource manager --------------------------------------------------------
    async def _on_event(self, event) -> None:
        """Called by the resource manager on the deployment's loop; never blocks it for long."""
        if isinstance(event, HostAvailable):
            await self.adopt(event.host)
        elif isinstance(event, HostReturnRequested):
            self._return_requested(event)
        elif isinstance(event, HostLost):
            await self._lost(event.host, event.reason)

    def _return_requested(self, event: HostReturnRequested) -> None:
        host_id = event.host.host_id
        if host_id not in self.borrowed:
            # the manager can ask a host back while its grant is still on the way here (a
            # loaded machine starts workers slowly): the request holds from the adoption on
            self._asked_early[host_id] = event
            return
        if host_id in self.returns or host_id in self._losing:
            return
        self.returns[host_id] = ReturnRequest(host_id, event.deadline)
        self._mark("return-requested", host_id)
        self._event("host", f"{self.rm_name} wants {host_id} back within "
                            f"{event.deadline - time.time():.1f} s")
        self._returning[host_id] = asyncio.create_task(self._return_due(host_id, event.deadline))

    async def _return_due(self, host_id: str, deadline: float) -> None:
        try:
            record = await self.give_back(host_id, deadline, ReturnHost(host_id, reason="requested by "
                                                                                     f"{self.rm_name}"))
            if not record.applied and (host_id not in self.borrowed or host_id in self._leaving):
                return                    # a ReturnHost applied by hand or a policy is giving it back
            self.fleet.record(record)
            if not record.applied:
                self._event("host", f"could not return {host_id} by its deadline: {record.reason}")
        except Exception as exc:
            self._event("host", f"returning {host_id} failed: {type(exc).__name__}: {exc}")
        finally:
            self._returning.pop(host_id, None)

    async def _lost(self, host: Host, reason: str) -> None:
        """Reported once per host, whoever notices first (its watcher, or the manager). The host
        leaves :attr:`borrowed` once its workers have left the placement, which waits for a
        reconfiguration in progress: before, ``resources()`` showed the host gone while
        ``placement()`` still held its workers, for as long as that wait lasted."""
        held = self.borrowed.get(host.host_id)
        if held is None or host.host_id in self._losing:
            return
        self._losing.add(host.host_id)
        self.returns.pop(host.host_id, None)
        self._stop_watching(held.workers)
        on_host = [p for p, pe in self.fleet.placement().pes.items() if pe.worker in held.workers]
        text = f"host {host.host_id} lost: {reason or 'no reason given'}"
        self._mark("lost", host.host_id)
        self._event("host-lost", text + (f"; its PEs {', '.join(on_host)} are gone" if on_host else ""))
        try:
            await self.fleet.remove_workers(set(held.workers))    # nobody calls a dead worker (30 s timeouts)
        finally:
            self.borrowed.pop(host.host_id, None)
            self._losing.discard(host.host_id)
        if on_host:
            await self.fleet.fail(f"{text}. PEs {', '.join(on_host)} ran there (with checkpoint= on, "
                                 f"the last checkpoint is restored onto the hosts left)")

    # -- watching borrowed workers ----------------------------------------------------------------
    def _stop_watching(self, workers) -> None:
        """Cancel the watchers of ``workers`` (not the one calling: it is about to return)."""
        for w in workers:
            task = self._watchers.pop(w, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()

    async def _watch(self, worker: str, host_id: str) -> None:
        """The deployment's watcher, but a borrowed worker that goes is a lost host."""
        async def lost(worker: str, exc: Exception) -> None:
            if host_id in self.borrowed:
                await self._lost(self.borrowed[host_id], f"worker {worker} went away ({type(exc).__name__})")
        await self.fleet.watch(worker, lost)

    # -- records ----------------------------------------------------------------------------------
    def _event(self, kind: str, text: str) -> None:
        logger.info("%s", text)
        self.fleet.event(kind, text)

    def _mark(self, what: str, host: str, t0: float | None = None, **figures) -> None:
        now = time.monotonic()
        self.timeline.append({"t": now, "what": what, "host": host,
                              **({"took_s": now - t0} if t0 is not None else {}), **figures})
        self.on_mark(self.timeline[-1])

    on_mark: Callable[[dict], None] = staticmethod(lambda entry: None)   # the deployment's decision log


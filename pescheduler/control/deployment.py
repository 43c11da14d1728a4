"""Deploying an application and the handle to the running deployment.

Example::

    import pescheduler
    with pescheduler.deploy(app, workers=3) as dep:
        print(dep.placement().pes)
        dep.wait()          # finite sources: until every sink has flushed

The controller runs in the deploying process on its own event loop thread;
the public methods are synchronous wrappers around it. Without ``cluster``
it starts an embedded ``LocalCluster`` (single-threaded worker processes, one
per core, at least two) and closes it on stop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import pickle
import threading
import time
import uuid
from collections import deque
from types import MappingProxyType
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Coroutine

import cloudpickle
from distributed import Client

from .. import config
from ..plan.app import Application
from ..plan.compiler import compile_app
from ..errors import DeploymentFailed
from .cluster import EmbeddedCluster
from .hosts import HostManager
from . import statefile
from ..worker.pehost import PLUGIN_NAME, PEHostPlugin
from ..plan.placement import Placement, Slot
from ..plugins import Plugins, activate
from ..worker.specs import PESpec
from .monitor import MetricsSnapshot
from .status import StatusBoard
from ..actions import Action, ActionRefused, BorrowHosts, ReturnHost
from .resources import ResourceView
from .controller import Controller, policy_configs, select_policies
from .reconfigure import ApplyRecord, execute, plan_reconfiguration
from ..plan.transforms import NoSlotLeft, transform, with_slots
from ..plan.wiring import build_specs, channel_ids

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 2.0
COMMAND_POLL_S = 0.5     # how often a stop command from the CLI is looked for


class LoopThread:
    """An asyncio loop in a daemon thread; ``run`` submits a coroutine and waits for it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


def default_worker_count() -> int:
    """``pescheduler.cluster.workers``, else one worker per core and at least two."""
    configured = config.get("cluster.workers")
    return int(configured) if configured else max(2, os.cpu_count() or 1)


def default_rm(cluster: str | None) -> str | None:
    """``pescheduler.rm.name``, else ``local`` for an embedded cluster and none for a given one."""
    configured = config.get("rm.name")
    if configured:
        return None if configured == "none" else configured
    return "local" if cluster is None else None


def deploy(app: Application, *, workers: int | None = None, cluster: str | None = None,
           plugins: tuple[str, ...] | list[str] = (), config_file: str | None = None,
           rm: str | None = None, policies: list[str] | tuple[str, ...] | None = None,
           **options: Any) -> "Deployment":
    """Compile ``app`` into a placement and run it; returns the running :class:`Deployment`.

    ``rm`` names the resource manager hosts are borrowed from (``"local"``,
    ``"spark"``, a plug-in's, or ``"none"``); see :func:`default_rm`.
    ``policies`` names the active policies, by entry-point name (default
    ``pescheduler.policies.default``: ``rate`` and ``copy``); ``[]`` runs none,
    and actions are then applied only by hand (:meth:`Deployment.apply`).
    """
    if config_file:
        config.load_file(config_file)
    if options:
        unknown = ", ".join(sorted(options))
        raise TypeError(f"deploy() got options this version does not support yet: {unknown}")
    rm = default_rm(cluster) if rm is None else (None if rm == "none" else rm)
    if policies is None:
        policies = config.get("policies.default") or ()
    elif isinstance(policies, str):          # policies="rate": one name, not its letters
        policies = [policies]
    dep = Deployment(app, workers=workers, cluster=cluster, plugins=tuple(plugins), rm=rm,
                     policies=tuple(policies))
    try:
        dep._start()
    except BaseException:
        dep._shutdown()
        raise
    return dep


class Deployment:
    """A running application: placement, status, dead letters, wait and stop."""

    def __init__(self, app: Application, *, workers: int | None, cluster: str | None,
                 plugins: tuple[str, ...], rm: str | None = None, policies: tuple[str, ...] = ()) -> None:
        self.app = app
        self.n_workers = workers or default_worker_count()
        self.cluster_address = cluster
        self.plugin_modules = plugins
        self.plugins: Plugins | None = None
        self.cluster: EmbeddedCluster | None = None
        self.client: Client | None = None
        self.scheduler_address = ""
        self._placement: Placement | None = None
        self.worker_info: dict[str, dict] = {}
        self.board = StatusBoard(app.name)
        self._dead_letters: deque = deque(maxlen=int(config.get("dead-letters.keep")))
        self._loop = LoopThread(f"pescheduler-{app.name}")
        self._done: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self.id = f"{app.name}-{uuid.uuid4().hex[:8]}"
        self.channels: dict = {}
        self._epoch = 0
        self._records: list[ApplyRecord] = []
        self._reconfiguring: asyncio.Lock | None = None
        self._last_cold_start_s: float | None = None
        self.hosts = HostManager(self, rm)
        self.policy_names = tuple(policies)
        self.controller: Controller | None = None     # runs the policies; its decisions: .decisions

    # -- public API ---------------------------------------------------------------------
    def placement(self) -> Placement:
        """operators -> PEs -> workers -> hosts, as deployed now."""
        return self._placement

    def status(self) -> dict:
        """The status dict shown by the live view and ``python -m pescheduler status``."""
        return {"id": self.id, **self.board.status()}

    def snapshot(self) -> MetricsSnapshot:
        """The last monitor window: the immutable snapshot policies receive."""
        return self.board.monitor.latest

    def resources(self) -> ResourceView:
        """The resource manager's view policies receive: hosts held, lendable, returns due."""
        return self.hosts.view()

    def next_snapshot(self, timeout: float | None = None) -> MetricsSnapshot:
        """Wait for the monitor's next window and return it (``TimeoutError`` after ``timeout``)."""
        async def wait() -> MetricsSnapshot:
            await asyncio.wait_for(self._sampled.wait(), timeout)
            return self.board.monitor.latest
        return self._loop.run(wait())

    def pe_stats(self) -> dict[str, dict]:
        """Every PE's raw cumulative counters now, fetched from the workers (``pe_id -> stats``):
        what the monitor folds into snapshots, plus router counts and first-input times."""
        async def fetch() -> dict[str, dict]:
            answers = await asyncio.gather(*(self.client.rpc(w).pe_stats(deployment=self.id, dead_letters=False)
                                             for w in self._running_on()))
            return {pe: stats for a in answers for pe, stats in a["pes"].items()}
        return self._loop.run(fetch())

    def dead_letters(self) -> list[dict]:
        """Dead letters received so far (the newest ``pescheduler.dead-letters.keep``)."""
        return list(self._dead_letters)

    def apply(self, action: Action, timeout: float = 30.0) -> ApplyRecord:
        """Apply an action (Fuse, Split, Move, Replicate, Release) to the running app.

        An impossible action is refused with a reason and the stream is not
        disturbed. Otherwise the reconfiguration protocol (reconfigure.py)
        runs and the record says how long the affected path paused.
        """
        return self._loop.run(self._apply(action, timeout))

    def records(self) -> list[ApplyRecord]:
        """Every action applied or refused so far, oldest first."""
        return list(self._records)

    def wait(self, timeout: float | None = None) -> dict:
        """Block until the app finished (finite sources), failed, or was stopped.

        Raises :class:`DeploymentFailed` with the reason if it failed, and
        ``TimeoutError`` if ``timeout`` passes first.
        """
        self._loop.run(asyncio.wait_for(self._done.wait(), timeout))
        status = self.status()
        if status["state"] == "failed":
            raise DeploymentFailed(status["error"] or "deployment failed")
        return status

    def stop(self, drain_timeout: float = 30.0) -> dict:
        """Drain sources, let windows and sinks flush, stop the PEs, close an embedded cluster."""
        if self._stopped:
            return self.status()
        try:
            if self.client is not None and self.board.state == "running":
                self._loop.run(self._drain(drain_timeout))
        finally:
            self._shutdown()
        return self.status()

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- start --------------------------------------------------------------------------
    def _start(self) -> None:
        self._loop.run(self._astart())

    async def _astart(self) -> None:
        self._done = asyncio.Event()
        self._reconfiguring = asyncio.Lock()
        self._sampled = asyncio.Event()
        self.plugins = activate(self.plugin_modules)
        chosen = select_policies(self.plugins, self.policy_names)     # an unknown name fails before any start
        self.hosts.check()
        if self.cluster_address is None:
            self.cluster = EmbeddedCluster(self.n_workers)
            self.scheduler_address = await self.cluster.start()
        else:
            self.scheduler_address = self.cluster_address
        self.client = await Client(self.scheduler_address, asynchronous=True)
        await self.client.register_plugin(PEHostPlugin(), name=PLUGIN_NAME)
        workers = await self._workers()
        self._placement = compile_app(self.app, self.plugins, workers,
                                      {w: self.worker_info[w]["host"] for w in workers})
        await self._launch(self._placement)
        self.board.started(self._placement, int(config.get("monitor.history")))
        if chosen:
            timeout = config.get_seconds("policies.apply-timeout")

            async def apply(action: Action) -> ApplyRecord:
                if self.board.stopping:          # a drain has begun: the layout stays as it is
                    return ApplyRecord(action, False, "the deployment is stopping")
                return await self._apply(action, timeout)

            self.controller = Controller(
                chosen, apply, configs=policy_configs(chosen),
                cooldown_s=config.get_seconds("policies.cooldown"), resources=self.resources,
                log_path=config.get("policies.decision-log"), deployment=self.id,
                on_decision=lambda d: self.board.event("policy", d.text()))
            self.board.event("policy", f"active: {', '.join(chosen)}")
        if self.cluster is not None:
            statefile.write(self.scheduler_address, self.app.name)
        self._tasks = [asyncio.create_task(self._watch(w)) for w in self._placement.workers]
        self._tasks.append(asyncio.create_task(self._monitor()))
        self.hosts.start()

    async def _workers(self) -> list[str]:
        """Addresses of the workers to place on, each with its PE host answering."""
        if self.cluster is not None:
            await self.cluster.wait_for_workers(self.client)
        info = await self.client.scheduler.identity(n_workers=-1)
        addresses = sorted(info["workers"])
        if not addresses:
            raise DeploymentFailed(f"the cluster at {self.scheduler_address} has no workers")
        answers = await asyncio.gather(*(self.client.rpc(w).pe_info() for w in addresses))
        for address, answer in zip(addresses, answers):
            answer["host"] = info["workers"][address].get("host", "")
            self.worker_info[address] = answer
        return addresses

    async def _launch(self, placement: Placement) -> None:
        """Ship every PE's spec, then start them (receivers exist before senders connect)."""
        self.channels = channel_ids(placement, self.id, 0)
        specs = build_specs(placement, self.worker_info, self.id, self.channels)
        by_worker: dict[str, list[PESpec]] = {}
        for pe_id, spec in specs.items():
            by_worker.setdefault(placement.pes[pe_id].worker, []).append(spec)
        await asyncio.gather(*(self.client.rpc(w).pe_deploy(specs=cloudpickle.dumps(s), plugins=self.plugin_modules)
                               for w, s in by_worker.items()))
        await asyncio.gather(*(self.client.rpc(w).pe_start(deployment=self.id, pe_ids=[s.pe_id for s in ss])
                               for w, ss in by_worker.items()))
        await self._warm_slots(placement)

    async def _warm_slots(self, placement: Placement) -> None:
        """Warm every standard slot's worker: plug-ins imported, a thread per slot started."""
        per_worker: dict[str, int] = {}
        for slot in placement.slots.values():
            per_worker[slot.worker] = per_worker.get(slot.worker, 0) + 1
        await asyncio.gather(*(self.client.rpc(w).pe_warm(plugins=self.plugin_modules, slots=n)
                               for w, n in per_worker.items()))

    # -- reconfiguration -----------------------------------------------------------------
    async def _apply(self, action: Action, timeout: float) -> ApplyRecord:
        if isinstance(action, (BorrowHosts, ReturnHost)):
            return await self.hosts.apply(action, timeout)
        async with self._reconfiguring:
            old = self._placement
            try:
                if self.board.state != "running":
                    raise ActionRefused(f"the deployment is {self.board.state}")
                new = transform(old, action)
                plan = plan_reconfiguration(old, new, self.channels, self.id, self._epoch + 1)
                done = [p for p in plan.retired if self.board.pe_state.get(p) in ("finished", "failed", "stopped")]
                if done:
                    raise ActionRefused(f"PE {done[0]!r} is {self.board.pe_state.get(done[0])}: nothing to move")
            except NoSlotLeft as exc:
                try:
                    new = await self._cold_slot(old, action, exc)
                except ActionRefused as refused:
                    return self._record(ApplyRecord(action, False, str(refused)))
                old = self._placement
                plan = plan_reconfiguration(old, new, self.channels, self.id, self._epoch + 1)
            except ActionRefused as exc:
                return self._record(ApplyRecord(action, False, str(exc)))
            self._epoch += 1
            try:
                steps: dict[str, float] = {}
                pause = await execute(self.client.rpc, old, new, plan, self.worker_info, self.id,
                                      f"{self.id}/reconf/{self._epoch}", timeout, self.plugin_modules, steps)
            except Exception as exc:
                logger.error("reconfiguration %r failed", action, exc_info=True)
                await self._fail(f"reconfiguration {action!r} failed: {type(exc).__name__}: {exc}")
                return self._record(ApplyRecord(action, False, f"failed: {exc}"))
            self._placement, self.channels = new, plan.channels
            self.board.replaced(new)
            moved = {op: (old.pe_of(op), new.pe_of(op)) for op in new.plan.ops if op in old.plan.ops
                     and (old.pe_of(op), old.pes[old.pe_of(op)].worker) != (new.pe_of(op), new.pes[new.pe_of(op)].worker)}
            return self._record(ApplyRecord(action, True, getattr(action, "reason", ""), pause * 1000,
                                            plan.retired, plan.created, moved, steps=steps))

    async def _cold_slot(self, old: Placement, action: Action, exc: NoSlotLeft) -> Placement:
        """No warm slot is left: start a new worker (a cold start) with one slot, and place there.

        Only an embedded cluster can grow this way; on another cluster the
        action is refused (borrow a host instead). The record's ``cold``
        figure says how long the worker took to start.
        """
        if self.cluster is None:
            raise ActionRefused(f"{exc} and the cluster at {self.scheduler_address} is not ours to grow: "
                                f"borrow a host (BorrowHosts) first")
        t0 = time.perf_counter()
        before = set(old.workers)
        await self.cluster.grow(self.client)
        await self._workers()
        joined = [w for w in self.worker_info if w not in before]
        if not joined:
            raise ActionRefused(f"{exc}; starting a new worker failed")
        worker = joined[0]
        host = self.worker_info[worker]["host"]
        slot_id = f"slot-{max((int(k.rsplit('-', 1)[1]) for k in old.slots), default=0) + 1}"
        grown = dataclasses.replace(old, workers=old.workers + (worker,),
                                    hosts=MappingProxyType({**old.hosts, worker: host}),
                                    slots=MappingProxyType({**old.slots, slot_id: Slot(worker, host)}))
        self._placement = grown
        await self._warm_slots(grown)
        self._tasks.append(asyncio.create_task(self._watch(worker)))
        self.board.replaced(grown)
        self.board.event("cold-start", f"no warm slot for {action!r}: started worker {worker} "
                                       f"in {time.perf_counter() - t0:.2f} s")
        self._last_cold_start_s = time.perf_counter() - t0
        return transform(grown, action)

    def _record(self, record: ApplyRecord) -> ApplyRecord:
        self._records.append(record)
        if record.applied:
            self.board.event("reconfigure", f"{record.action!r}: {len(record.moved)} operators moved, "
                                            f"pause {record.pause_ms:.1f} ms")
        else:
            self.board.event("refused", f"{record.action!r}: {record.reason}")
        return record

    # -- the worker set (hosts.py borrows and returns hosts) --------------------------------
    async def _add_workers(self, host_id: str, infos: dict[str, dict]) -> None:
        """Workers of ``host_id`` (their ``pe_info`` answers) join the placement."""
        async with self._reconfiguring:
            for worker, info in infos.items():
                self.worker_info[worker] = {**info, "host": host_id}
            pl = self._placement
            hosts = {**pl.hosts, **{w: host_id for w in infos}}
            grown = replace(pl, workers=pl.workers + tuple(w for w in infos if w not in pl.workers),
                            hosts=MappingProxyType(hosts))
            self._placement = with_slots(grown, int(config.get("standard.slots-per-host")))
            self.board.replaced(self._placement)
        await self._warm_slots(self._placement)

    def _running_on(self) -> list[str]:
        """Workers of the placement plus any still running a PE (a host being given back has
        left ``workers`` while its PEs move off)."""
        pl = self._placement
        return list(dict.fromkeys(list(pl.workers) + [pe.worker for pe in pl.pes.values()]))

    async def _remove_workers(self, workers: set[str]) -> None:
        """``workers`` leave the placement: nothing new is placed there (their PEs move separately)."""
        async with self._reconfiguring:
            pl = self._placement
            self._placement = replace(
                pl, workers=tuple(w for w in pl.workers if w not in workers),
                hosts=MappingProxyType({w: h for w, h in pl.hosts.items() if w not in workers}),
                slots=MappingProxyType({k: s for k, s in pl.slots.items() if s.worker not in workers}))
            self.board.replaced(self._placement)

    # -- watching ---------------------------------------------------------------------
    async def _watch(self, worker: str, on_lost=None) -> None:
        """Long-poll one worker's PE states. A lost worker fails the deployment, unless
        ``on_lost(worker, exc)`` handles it (a borrowed host's worker: a lost host)."""
        version = -1
        while not self._done.is_set():
            try:
                answer = await self.client.rpc(worker).pe_wait(deployment=self.id, version=version,
                                                               timeout=WATCH_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._done.is_set():
                    if on_lost is not None:
                        await on_lost(worker, exc)
                    else:
                        await self._fail(f"lost worker {worker}: {type(exc).__name__}: {exc}")
                return
            version = answer["version"]
            self.board.pe_states(answer["pes"])
            failed = [s["error"] for s in answer["pes"].values() if s["state"] == "failed"]
            if failed:
                await self._fail(failed[0])
                return
            if self.board.all_finished() and not self._done.is_set():
                await self._collect()
                self.board.finish("finished")
                self._done.set()

    async def _monitor(self) -> None:
        """Every monitor interval collect counters and publish status; obey a stop command.

        Commands are polled every ``COMMAND_POLL_S`` whatever the interval, so a long
        interval never delays ``python -m pescheduler stop``.
        """
        interval = config.get_seconds("monitor.interval")
        loop = asyncio.get_running_loop()
        due = loop.time() + interval
        control: asyncio.Task | None = None      # the controller's round; never two at once
        ticked = None

        def report(task: asyncio.Task) -> None:
            """A failed round (a bug, not a policy: those are quarantined) is logged; the next runs."""
            if not task.cancelled() and task.exception() is not None:
                logger.error("control round failed", exc_info=task.exception())

        try:
            while not self._done.is_set():
                try:
                    await asyncio.wait_for(self._done.wait(), max(0.0, min(due, loop.time() + COMMAND_POLL_S) - loop.time()))
                except asyncio.TimeoutError:
                    pass
                if loop.time() >= due:
                    await self._collect()
                    due = loop.time() + interval
                    snap = self.board.monitor.latest
                    if (self.controller is not None and (control is None or control.done()) and snap is not ticked
                            and self.board.state == "running" and not self.board.stopping):
                        ticked = snap          # a round runs beside the monitor: applying may take a while
                        control = asyncio.create_task(self.controller.tick(snap, self._placement))
                        control.add_done_callback(report)
                command = await self._command()
                if command == "stop" and not self._done.is_set():
                    self.board.event("stop", "stop requested from the command line")
                    await self._drain(30.0)
        finally:
            if control is not None and not control.done():
                control.cancel()
                await asyncio.gather(control, return_exceptions=True)

    async def _collect(self) -> None:
        try:
            answers = await asyncio.gather(*(self.client.rpc(w).pe_stats(deployment=self.id) for w in self._running_on()))
        except Exception as exc:        # a lost worker is reported by its watcher
            logger.debug("collect failed: %s", exc)
            return
        for answer in answers:
            for dead in answer["dead_letters"]:
                self._keep_dead_letter(dead)
        self.board.update(answers)
        self._sampled.set()                 # wake next_snapshot() callers, then re-arm
        self._sampled = asyncio.Event()
        try:
            await self.client.set_metadata(["pescheduler", "deployments", self.id], self.status())
        except Exception as exc:
            logger.debug("publishing status failed: %s", exc)

    def _keep_dead_letter(self, dead: dict) -> None:
        item = dead["item"]
        dead["item"] = pickle.loads(item["pickle"]) if "pickle" in item else item["repr"]
        self._dead_letters.append(dead)
        path = config.get("dead-letters.path")
        if path:
            with open(os.path.expanduser(path), "a") as f:
                f.write(json.dumps(dead, default=repr) + "\n")

    async def _command(self) -> str | None:
        try:
            command = await self.client.get_metadata(["pescheduler", "commands", self.id], default=None)
            if command:
                await self.client.set_metadata(["pescheduler", "commands", self.id], None)
            return command
        except Exception:
            return None

    async def _fail(self, reason: str) -> None:
        if self._done.is_set():
            return
        self.board.finish("failed", reason)
        self.board.event("failed", reason.strip().splitlines()[0])
        await self._stop_pes()
        self._done.set()

    # -- stop ---------------------------------------------------------------------------
    async def _drain(self, timeout: float) -> None:
        """End the sources as if exhausted, so windows fire and sinks flush, then stop."""
        self.board.stopping = True
        if not self._done.is_set():
            await asyncio.gather(*(self.client.rpc(w).pe_drain(deployment=self.id) for w in self._running_on()),
                                 return_exceptions=True)
            try:
                await asyncio.wait_for(self._done.wait(), timeout)
            except asyncio.TimeoutError:
                self.board.event("stop", f"drain did not finish within {timeout:.0f}s; stopping anyway")
        if self.board.state in ("running", "starting"):
            self.board.finish("stopped")
        self._done.set()

    async def _stop_pes(self) -> None:
        if self._placement is None:
            return
        await asyncio.gather(*(self.client.rpc(w).pe_stop(deployment=self.id) for w in self._running_on()),
                             return_exceptions=True)

    def _shutdown(self) -> None:
        """Stop PEs, close the client and an embedded cluster, stop the loop thread."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._loop.run(self._aclose(), timeout=60)
        finally:
            self._loop.close()
            statefile.remove()

    async def _aclose(self) -> None:
        if self._done is not None:
            if self.board.state in ("running", "starting"):
                self.board.finish("stopped")
            self._done.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.client is not None:
            await self._stop_pes()
            await self.hosts.close()
            try:
                await self.client.set_metadata(["pescheduler", "deployments", self.id], self.status())
            except Exception:
                pass
            await self.client.close()
        if self.cluster is not None:
            await self.cluster.close()

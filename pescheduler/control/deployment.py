"""Deploying an application and the handle to the running deployment.

Example::

    import pescheduler
    with pescheduler.deploy(app, workers=3) as dep:
        print(dep.placement().pes)
        dep.wait()          # finite sources: until every sink has flushed

The control plane runs in the deploying process on its own event loop thread;
:class:`Deployment` is a thin synchronous facade over its parts, one object each:

* ``gateway.py``: every call to the workers and the scheduler (:class:`WorkerGateway`);
* ``reconfigurer.py``: the only writer of the placement, channels and epoch;
  ``apply(action) -> ApplyRecord``, cold start included (:class:`Reconfigurer`);
* ``control_loop.py``: collect → snapshot → policies → apply → record (:class:`ControlLoop`);
* ``state.py``: the deployment's and PEs' states (:class:`DeploymentState`),
  which ``status.py`` views;
* ``hosts.py``: borrowed hosts, through the small :class:`~pescheduler.control.hosts.Fleet` protocol.

Without ``cluster`` it starts an embedded ``LocalCluster`` (single-threaded
worker processes, one per core, at least two) and closes it on stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from typing import Any, Coroutine

from distributed import Client

from .. import config
from ..actions import Action
from ..checkpoint import CheckpointCoordinator
from ..checkpoint.restore import load_states
from ..checkpoint.settings import CheckpointSettings, checkpoint_settings, refuse_unreplayable
from ..state.settings import backend_name, check_state_dir
from ..errors import DeploymentFailed
from ..lift import python_calls
from ..plan.app import Application
from ..plan.compiler import compile_app
from ..plan.placement import Placement
from ..apploader import check_app
from ..plugins import Plugins, activate, prepare
from ..restart import RestartStrategy
from ..worker.pehost import PLUGIN_NAME, PEHostPlugin
from ..plan.outputs import written_paths
from . import statefile
from .claims import claim_on_cluster, free_name, refuse_same_name, refuse_same_outputs, withdraw_on_cluster
from .cluster import HOST as CLUSTER_HOST, EmbeddedCluster
from .control_loop import ControlLoop
from .controller import Controller, append_log, event, policy_configs, select_policies
from .deadletters import DeadLetters
from .stopsocket import StopServer
from .gateway import WorkerGateway
from .hosts import HostManager
from ..metrics import MetricsSnapshot
from .monitor import Monitor
from .protocol import ApplyRecord, pe_report
from .reconfigurer import Reconfigurer
from .recovery import Recovery
from ..resources import ResourceView
from .state import DeploymentState
from .status import status_view

logger = logging.getLogger(__name__)
DASHBOARD_IMPORT_WAIT_S = 30.0    # the longest a step of the dashboard's import holds the reconfiguration lock

WATCH_TIMEOUT_S = 2.0
CLOSE_CLUSTER_S = 20.0     # an embedded cluster that does not close within this is left to its atexit
FINAL_COLLECTS = 3         # tries of the last collect when every PE finished (each bounded per worker)


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
           security: Any = None, checkpoint: Any = None, checkpoint_interval: Any = None,
           restore: Any = None, name: str | None = None, state: str | None = None,
           suffix: bool = False, latency: str | float | None = None, **options: Any) -> "Deployment":
    """Compile ``app`` into a placement and run it; returns the running :class:`Deployment`.

    ``rm`` names the resource manager hosts are borrowed from (``"local"``,
    ``"spark"``, a plug-in's, or ``"none"``); see :func:`default_rm`.
    ``policies`` names the active policies, by entry-point name (default
    ``pescheduler.policies.default``: ``rate`` and ``copy``); ``[]`` runs none,
    and actions are then applied only by hand (:meth:`Deployment.apply`).
    ``security``: a ``distributed.Security`` for a TLS cluster (``True``: the
    embedded cluster with throw-away certificates); see docs/security.md.
    ``checkpoint``: a directory or fsspec URL (``True``: ``pescheduler.checkpoint.storage``) where
    aligned checkpoints are taken every ``checkpoint_interval`` (``"1s"``); a lost worker then
    restores the last one (``pescheduler.restart.*``). ``restore="latest"`` or an id starts from a
    checkpoint in that storage; see docs/checkpoints.md.
    ``name``: what ``status NAME`` and ``stop NAME`` match (default: the app's name, suffixed
    ``-2``... when one of that name runs, on this machine or on ``cluster``); a given name that runs already on this
    machine (embedded) or on ``cluster`` is refused (:class:`~pescheduler.errors.DeploymentClash`), as is
    a deployment writing a local path a running one writes. ``suffix=True``: a given name that runs
    already is suffixed ``-2``, ``-3``... instead (``deploy --suffix``).
    ``state``: where KEYED operators keep their keyed state, ``"memory"`` or ``"disk"``
    (RocksDB on each worker's disk; default ``pescheduler.state.backend``); see docs/state.md.
    ``latency``: the latency target every channel sizes its batches by (``"1ms"``, ``0``: never
    wait; default ``pescheduler.batch.latency``); see docs/latency.md.
    """
    if config_file:
        config.load_file(config_file)
    # The command line's pre-flight checks, before any process starts: plug-ins, settings, the app.
    found = prepare(tuple(plugins))
    check_app(app, found)
    if options:
        unknown = ", ".join(sorted(options))
        raise TypeError(f"deploy() got options this version does not support yet: {unknown}")
    if security is True and cluster is not None:
        raise ValueError("security=True makes throw-away certificates for the embedded cluster; for the "
                         f"cluster at {cluster} pass its distributed.Security")
    rm = default_rm(cluster) if rm is None else (None if rm == "none" else rm)
    checkpoints = checkpoint_settings(app.name, checkpoint, checkpoint_interval, restore)
    state = backend_name(state)
    if cluster is None and (state == "disk" or checkpoints is not None):
        check_state_dir()                # the embedded workers' stores and checkpoint copies go there
    latency_s = config.get_seconds("batch.latency") if latency is None else config.seconds(latency, "latency")
    if checkpoints is not None:
        refuse_unreplayable(app, found)
    if policies is None:
        policies = config.get("policies.default") or ()
    elif isinstance(policies, str):          # policies="rate": one name, not its letters
        policies = [policies]
    dep = Deployment(app, workers=workers, cluster=cluster, plugins=tuple(plugins), rm=rm,
                     policies=tuple(policies), security=security)
    dep.checkpoint_settings = checkpoints
    _claim(dep, name, written_paths(app, found), suffix)
    dep.state_backend = state
    dep.latency_s = latency_s
    try:
        dep._start()
    except BaseException:
        dep._shutdown()
        raise
    return dep


def _claim(dep: "Deployment", name: str | None, outputs: list[str], suffix: bool) -> None:
    """Name the deployment and refuse clashes with those running or starting on this machine
    (``claims.py``), then claim name and paths, as one step under the state directory's lock: two
    deploys started at once cannot both pass. A cluster's own are checked once connected
    (:meth:`Deployment._astart`)."""
    dep.name, dep.outputs = statefile.checked_name(name or dep.name), outputs
    dep.unique_name = name is not None and not suffix
    with statefile.locked():
        running = statefile.running() + statefile.claims()
        if dep.cluster_address is None and dep.unique_name:
            refuse_same_name(dep.name, running, "on this machine")
        elif dep.cluster_address is None:        # recorded apart, so `list` and `stop` see both
            dep.name = free_name(dep.name, {s["name"] for s in running})
        refuse_same_outputs(dep.name, outputs, running)
        if dep.cluster_address is None:
            statefile.claim(dep.name, dep.app.name, outputs)


def _dashboard(scheduler: str, info: dict) -> str:
    """The Dask dashboard of the scheduler at ``scheduler`` (``""`` when it serves none)."""
    port = (info.get("services") or {}).get("dashboard")
    host = scheduler.split("://", 1)[-1].rsplit(":", 1)[0]
    return f"http://{host}:{port}/status" if port else ""


# A PE's error naming one of these saw a channel break: maybe only because its peer was killed.
_BROKEN_CHANNEL = ("ConnectionResetError", "BrokenPipeError", "IncompleteReadError", "ConnectionRefusedError",
                   "CommClosedError", "StreamClosedError")


class Deployment:
    """A running application: placement, status, dead letters, wait and stop."""

    def __init__(self, app: Application, *, workers: int | None, cluster: str | None,
                 plugins: tuple[str, ...], rm: str | None = None, policies: tuple[str, ...] = (),
                 security: Any = None) -> None:
        self.app = app
        self.n_workers = workers or default_worker_count()
        self.cluster_address = cluster
        self.plugin_modules = plugins
        self.plugins: Plugins | None = None
        self.cluster: EmbeddedCluster | None = None
        self.client: Client | None = None
        self.scheduler_address = ""
        self.id = f"{app.name}-{uuid.uuid4().hex[:8]}"
        self.name = statefile.name_of(app.name)   # what `status NAME` and `stop NAME` match
        self.outputs: list[str] = []              # the local paths its sinks write (plan/outputs.py)
        self.unique_name = False                  # deploy(name=): a running one of that name is refused
        self.dashboard = ""                       # a given cluster's Dask dashboard, when it serves one
        self.security = security                  # distributed.Security (or True) for a TLS cluster
        self.state = DeploymentState()
        self.latency_s = config.get_seconds("batch.latency")   # deploy(latency=): the channels' target
        self.monitor = Monitor(int(config.get("monitor.history")))
        self.dead = DeadLetters({n.op_id: n.where[0] for n in app.nodes.values() if n.where})
        self.gateway: WorkerGateway | None = None
        self.reconfigurer: Reconfigurer | None = None
        self.loop: ControlLoop | None = None
        self._loop = LoopThread(f"pescheduler-{app.name}")
        self._done: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self._scheduler_lost = False
        self.hosts = HostManager(_Fleet(self), rm)
        self.policy_names = tuple(policies)
        self.checkpoint_settings: CheckpointSettings | None = None   # set by deploy(checkpoint=...)
        self.state_backend = "memory"                                   # set by deploy(state=...)
        self.checkpointer: CheckpointCoordinator | None = None
        self.recovery: Recovery | None = None
        self._generation = 0          # bumped by a restore: watch answers about older PEs are dropped
        self._watchers: dict[str, asyncio.Task] = {}

    # -- public API ---------------------------------------------------------------------
    def placement(self) -> Placement:
        """operators -> PEs -> workers -> hosts, as deployed now."""
        return self.reconfigurer.placement if self.reconfigurer else None

    def status(self) -> dict:
        """The status dict shown by the live view and ``python -m pescheduler status``."""
        status = {"id": self.id, "name": self.name, "outputs": self.outputs,
                  "client": getattr(self.client, "id", None),     # claims.with_lost: gone when it has left
                  **status_view(self.app.name, self.state, self.monitor.latest, self.placement(),
                                self.dead.count, self.hosts.view()),
                  "errors": self.dead.errors(), "recent_dead_letters": self.dead.recent(),
                  "reconfiguring": self.reconfigurer.in_flight() if self.reconfigurer else None}
        if self.checkpointer is not None:
            status["checkpoints"] = {**self.checkpointer.view(), "restart": self.recovery.view(),
                                     "restoring": self.reconfigurer.restoring_view()}
        return status

    def checkpoint(self, timeout: float | None = None) -> int:
        """Take a checkpoint now; its id once complete (``CheckpointError`` if it was aborted)."""
        if self.checkpointer is None:
            raise RuntimeError("checkpointing is off: deploy(app, checkpoint=DIR_OR_URL) turns it on")
        return self._loop.run(self.checkpointer.trigger(), timeout)

    def checkpoints(self) -> list[dict]:
        """Complete checkpoints of this run, oldest first (the newest 10 × ``retain``): id, time,
        duration_s, bytes, url, state_bytes, manifest_bytes and each PE's part (``pes``). Only the
        newest ``retain`` are still in the storage."""
        return [c.as_dict() for c in self.checkpointer.completed] if self.checkpointer else []

    def snapshot(self) -> MetricsSnapshot:
        """The last monitor window: the immutable snapshot policies receive."""
        return self.monitor.latest

    def resources(self) -> ResourceView:
        """The resource manager's view policies receive: hosts held, lendable, returns due."""
        return self.hosts.view()

    def next_snapshot(self, timeout: float | None = None) -> MetricsSnapshot:
        """Wait for the monitor's next window and return it (``TimeoutError`` after ``timeout``)."""
        async def wait() -> MetricsSnapshot:
            await asyncio.wait_for(self.loop.sampled.wait(), timeout)
            return self.monitor.latest
        return self._loop.run(wait())

    def pe_stats(self) -> dict[str, dict]:
        """Every PE's raw cumulative counters now, fetched from the workers (``pe_id -> stats``):
        what the monitor folds into snapshots, plus router counts and first-input times."""
        async def fetch() -> dict[str, dict]:
            answers = await self.gateway.stats(self.reconfigurer.running_on(), dead_letters=False)
            return {pe: stats for a in answers for pe, stats in a["pes"].items()}
        return self._loop.run(fetch())

    def dead_letters(self) -> list[dict]:
        """Dead letters received so far (the newest ``pescheduler.dead-letters.keep``)."""
        return list(self.dead.kept)

    def apply(self, action: Action, timeout: float = 30.0) -> ApplyRecord:
        """Apply an action (Fuse, Split, Move, Replicate, Release) to the running app.

        An impossible action is refused with a reason and the stream is not
        disturbed. Otherwise the reconfiguration protocol (protocol.py)
        runs and the record says how long the affected path paused.
        """
        return self._loop.run(self.reconfigurer.apply(action, timeout))

    def records(self) -> list[ApplyRecord]:
        """Every action applied or refused so far, oldest first."""
        return list(self.reconfigurer.records) if self.reconfigurer else []

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
        """Drain sources, let windows and sinks flush, stop the PEs, close an embedded cluster.
        A drain not done within ``drain_timeout`` s stops the PEs all the same (what sinks had not
        flushed is not published): the status's ``stop`` event names the PEs not finished, and a
        warning logs where each stood (its input channels ended or marked, its outputs' credits
        and first items)."""
        if self._stopped:
            return self.status()
        try:
            if self.client is not None and self.state.live:
                self._loop.run(self._drain(drain_timeout))
        finally:
            self._shutdown()
        return self.status()

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- what tests, benchmarks and the CLI read ------------------------------------------------
    @property
    def controller(self) -> Controller | None:
        """Runs the policies; its decisions: ``.decisions`` (None without policies)."""
        return self.loop.controller if self.loop else None

    @property
    def worker_info(self) -> dict[str, dict]:
        """Each worker's PE host answer (pid, cores, host)."""
        return self.reconfigurer.worker_info if self.reconfigurer else {}

    def activations(self) -> dict[str, float]:
        """Copy PE -> ms from the decision to replicate to the copy's first processed batch
        (seen at the monitor's next collect after it happened)."""
        return dict(self.reconfigurer.activations) if self.reconfigurer else {}

    @property
    def _last_cold_start_s(self) -> float | None:
        return self.reconfigurer.last_cold_start_s if self.reconfigurer else None

    # -- start --------------------------------------------------------------------------
    def _start(self) -> None:
        self._loop.run(self._astart())

    async def _astart(self) -> None:
        self._done = asyncio.Event()
        self.plugins = activate(self.plugin_modules)
        chosen = select_policies(self.plugins, self.policy_names)     # an unknown name fails before any start
        self.hosts.check(self.plugins.resource_managers)
        if self.cluster_address is None:
            self.cluster = EmbeddedCluster(self.n_workers, self.security, self._cluster_host())
            self.scheduler_address = await self.cluster.start()
            self.security = self.cluster.security
        else:
            self.scheduler_address = self.cluster_address
        self.client = await Client(self.scheduler_address, asynchronous=True,
                                   security=None if self.security is True else self.security)
        if self.cluster is None:
            self.dashboard = _dashboard(self.scheduler_address, self.client.scheduler_info())
            self.name = await claim_on_cluster(self.client, self.status(), self.unique_name)
            self._claimed_on_cluster = True
        await self.client.register_plugin(PEHostPlugin(), name=PLUGIN_NAME)
        self.gateway = WorkerGateway(self.client, self.id, self.plugin_modules)
        self.gateway.checkpoint = self.checkpoint_settings is not None
        self.gateway.state = self.state_backend
        self.reconfigurer = rc = Reconfigurer(self.gateway, self.state, self.id, self.cluster,
                                              int(config.get("standard.slots-per-host")))
        rc.host_actions, rc.on_failure = self.hosts.apply, self._fail
        rc.on_worker = lambda worker: self._watch_all([worker])
        log = config.get("policies.decision-log")
        rc.on_activation = lambda copy, ms: append_log(log, self.id, [event("activation", "activated", copy,
                                                                          {"ms": round(ms, 1)})])
        self.hosts.on_mark = lambda e: append_log(log, self.id, [event(
            "host", e["what"], e["host"], {k: v for k, v in e.items() if k not in ("t", "what", "host", "reason")},
            e.get("reason", ""))])
        if self.cluster is not None:
            await self.cluster.wait_for_workers(self.client)
        workers = await rc.known_workers()
        if not workers:
            raise DeploymentFailed(f"the cluster at {self.scheduler_address} has no workers")
        placement = compile_app(self.app, self.plugins, workers, {w: rc.worker_info[w]["host"] for w in workers},
                                self.latency_s)
        await rc.launch(placement, await self._restored(placement))
        self.state.running(placement.pes)
        self.state.event("deploy", f"{len(placement.pes)} PEs on "
                                   f"{len({pe.worker for pe in placement.pes.values()})} workers")
        for note in python_calls(self.app):
            self.state.event("python", note)
        self.loop = ControlLoop(self.gateway, rc, self.state, self.monitor, self.dead, self.status)
        self.loop.on_stop, self.loop.on_scheduler_lost = lambda: self._drain(30.0), self._lost_scheduler
        self.loop.on_dead_letters = lambda why: self._fail(why, final=True)   # a restore replays the same input
        if chosen:
            self.loop.controller = self._controller(chosen)
            self.state.event("policy", f"active: {', '.join(chosen)}")
        await self.gateway.publish(self.status())   # `stop NAME` right after the record finds a status
        if self.cluster is not None:      # `stop NAME` asks on the socket, then finds it by the record
            self._stop_server = await StopServer.start(self.name, self.loop.stop_requested, self._done,
                                                       lambda: self.state.state)
            statefile.write(self.scheduler_address, self.app.name, self.outputs, self.name)
        self._watch_all(placement.workers)
        self._tasks.append(asyncio.create_task(self.loop.run(self._done)))
        if self.cluster is not None:
            self._tasks.append(asyncio.create_task(self._dashboard_after_an_interval()))
        self._start_checkpoints()
        self.hosts.start(self.scheduler_address, None if self.security is True else self.security)

    async def _dashboard_after_an_interval(self) -> None:
        """Dask's bokeh pages on the embedded cluster once the run has lasted a monitor interval:
        a shorter run (most of a small app's) never imports bokeh; /pescheduler serves from the start.

        The import holds this process's GIL in bursts for 0.5-0.9 s of CPU, and the controller's
        calls in a reconfiguration's pause share that GIL: beside it, the first Release and Move
        after a deploy paused 38-46 and 67-135 ms where they pause 8-11 and 12-26 ms (a count window
        of 10^3 keys, session 77). So each of its steps runs under the reconfiguration lock: a
        reconfiguration or checkpoint asked meanwhile waits for the step, not the import, and its
        pause does not share the GIL with it (EmbeddedCluster.attach_dashboard)."""
        try:
            await asyncio.wait_for(self._done.wait(), config.get_seconds("monitor.interval"))
        except asyncio.TimeoutError:
            await self.cluster.attach_dashboard(lambda: self.reconfigurer.lock.held("a step of Dask's dashboard import"),
                                                DASHBOARD_IMPORT_WAIT_S)

    def _cluster_host(self) -> str:
        """Where the embedded cluster listens: loopback, or the address a resource manager's
        hosts reach it on (``cluster_network(settings)`` of its class: the lab's bridge, an object
        with ``address`` and ``remove()``, removed once the cluster has closed)."""
        make = getattr(self.plugins.resource_managers.get(self.hosts.rm_name or ""), "cluster_network", None)
        if make is not None:
            self._network = make(config.section(f"rm.{self.hosts.rm_name}"))
        return self._network.address if self._network is not None else CLUSTER_HOST

    _network = None          # what cluster_network made (closed after the cluster)
    _stop_server: StopServer | None = None   # where `stop NAME` asks an embedded deployment (stopsocket)
    _claimed_on_cluster = False  # claim_on_cluster published this one as starting on a given cluster

    def _controller(self, chosen: dict) -> Controller:
        timeout = config.get_seconds("policies.apply-timeout")

        async def apply(action: Action) -> ApplyRecord:
            if not self.state.live:          # a drain has begun: the layout stays as it is
                return ApplyRecord(action, False, f"the deployment is {self.state.state}")
            return await self.reconfigurer.apply(action, timeout)

        return Controller(chosen, apply, configs=policy_configs(chosen),
                          cooldown_s=config.get_seconds("policies.cooldown"), resources=self.resources,
                          log_path=config.get("policies.decision-log"), deployment=self.id,
                          on_decision=lambda d: self.state.event("policy", d.text()))

    # -- checkpoints (pescheduler/checkpoint/) ------------------------------------------------
    async def _restored(self, placement: Placement) -> dict[str, dict] | None:
        """``restore=``: the checkpoint's state mapped onto ``placement``."""
        ckpt = self.checkpoint_settings
        if ckpt is None or ckpt.restore_id is None:
            return None
        logger.info("restoring %s", ckpt.store.describe(ckpt.restore_id))
        self.state.event("restore", f"from {ckpt.store.describe(ckpt.restore_id)}")
        return await asyncio.to_thread(load_states, ckpt.store, ckpt.restore_id, placement)

    def _start_checkpoints(self) -> None:
        ckpt = self.checkpoint_settings
        if ckpt is None:
            return
        self.checkpointer = CheckpointCoordinator(self.gateway, self.reconfigurer, self.state, ckpt.store,
                                                  interval=ckpt.interval, timeout=ckpt.timeout, retain=ckpt.retain,
                                                  first_id=ckpt.store.next_id())
        self.monitor.checkpointed = self.checkpointer.last_pes
        self.recovery = Recovery(self, RestartStrategy.of_config())
        self.state.event("checkpoint", f"every {ckpt.interval:g} s to {ckpt.store.url}")
        self._tasks.append(asyncio.create_task(self.checkpointer.run(self._done)))

    # -- watching and ending -------------------------------------------------------------------
    def _watch_all(self, workers) -> None:
        """Watch each of ``workers`` that has no live watcher (a restore restarts the ended ones)."""
        for worker in workers:
            task = self._watchers.get(worker)
            if task is None or task.done():
                self._watchers[worker] = task = asyncio.create_task(self._watch(worker))
                self._tasks.append(task)

    async def _watch(self, worker: str, on_lost=None) -> None:
        """Long-poll one worker's PE states. A lost worker fails the deployment, unless
        ``on_lost(worker, exc)`` handles it (a borrowed host's worker: a lost host); a watch
        that fails because the scheduler went is a lost scheduler, not a lost worker."""
        version = -1
        while not self._done.is_set():
            generation = self._generation
            try:
                answer = await self.gateway.watch(worker, version, WATCH_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._done.is_set() or (self.recovery is not None and worker in self.recovery.dead):
                    return
                if not await self.gateway.scheduler_alive():
                    await self._lost_scheduler(f"{type(exc).__name__} from worker {worker}")
                elif on_lost is not None:
                    await on_lost(worker, exc)
                else:
                    await self._fail(f"lost worker {worker}: {type(exc).__name__}: {exc}", lost={worker})
                return
            version = answer["version"]
            if generation != self._generation or (self.recovery is not None and self.recovery.active):
                continue                 # about PEs a restore replaced (or is replacing)
            self.state.pes_reported(answer["pes"])
            failed = [s["error"] for s in answer["pes"].values() if s["state"] == "failed"]
            if failed:
                gone = await self._peer_gone(worker, failed[0])
                if generation != self._generation or (self.recovery is not None and self.recovery.active):
                    continue         # a restore began while the peers were probed: these PEs are gone
                if gone:             # the PE only saw its channel to a killed worker break
                    why = failed[0].strip().splitlines()[-1]
                    await self._fail(f"lost worker {gone}: a channel to it broke ({why})", lost={gone})
                else:
                    await self._fail(failed[0])
                return
            if self.state.all_finished() and not self._done.is_set():
                await self._finish()

    async def _peer_gone(self, reporter: str, error: str) -> str | None:
        """The worker a PE's broken channel points at, if it is gone, else None.

        A killed worker breaks its peers' channels at once (ConnectionResetError in
        the PE), often before its own watcher or the scheduler says so; the run's
        cause is then the lost worker, not the PE that noticed. A dead process
        refuses a connection at once; one the scheduler no longer lists is gone too.
        """
        if not any(name in error for name in _BROKEN_CHANNEL):
            return None
        others = sorted(w for w in self.reconfigurer.running_on() if w != reporter and w not in self._gone)
        return await self.gateway.first_gone(others) if others else None

    async def _finish(self) -> None:
        """Every PE finished: the last counters and dead letters in, then the verdict on them. The
        last collect is tried :data:`FINAL_COLLECTS` times (each worker's call bounded by
        ``calls.worker``): a loaded worker that missed one must not leave the final status without
        the dead letters still on it; one that misses every try is said in the events."""
        for _ in range(FINAL_COLLECTS):
            if await self.loop.collect() or self._done.is_set():
                break
        else:
            self.state.event("monitor", f"the last counters were not collected from every worker in "
                                        f"{FINAL_COLLECTS} tries: the final figures and dead letters may be short")
        if self._done.is_set():
            return
        verdict = self.dead.verdict(self.monitor.latest)
        if verdict:
            self.state.fail(verdict)
        else:
            self.state.end()
        self._done.set()

    async def _lost_scheduler(self, why: str) -> None:
        self._scheduler_lost = True
        await self._fail(f"lost scheduler {self.scheduler_address}: {why}", final=True)

    async def _fail(self, reason: str, lost: set[str] = frozenset(), final: bool = False) -> None:
        """Fail the run (once) and stop its PEs on the workers still there, quickly; unless
        checkpoints are on and a restart attempt is left (``final``: no restore tried)."""
        if not final and self.recovery is not None and self.state.live and self.recovery.handle(reason, set(lost)):
            return
        if self._done.is_set() or not self.state.fail(reason):
            return
        self._done.set()
        self._gone = set(lost)
        await self.gateway.stop(w for w in self.reconfigurer.running_on() if w not in lost)

    _gone: set = frozenset()         # workers known lost: nobody calls them again


    async def _drain(self, timeout: float) -> None:
        """End the sources as if exhausted, so windows fire and sinks flush, then stop."""
        if not self._done.is_set() and self.state.to("stopping"):
            await self.gateway.drain(self.reconfigurer.running_on())
            try:
                await asyncio.wait_for(self._done.wait(), timeout)
            except asyncio.TimeoutError:
                left = sorted(p for p, s in self.state.pe_state.items() if s != "finished")
                self.state.event("stop", f"drain did not finish within {timeout:g} s; stopping anyway "
                                         f"(not finished: {', '.join(left)})")
                logger.warning("the drain did not finish within %g s; its PEs:\n%s", timeout,
                               await pe_report(self.gateway, self.placement()))
        self.state.to("stopped")
        self._done.set()

    def _shutdown(self) -> None:
        """Stop PEs, close the client and an embedded cluster, stop the loop thread."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._loop.run(self._aclose(), timeout=60)
        finally:
            self._loop.close()
            statefile.remove(self.name)

    async def _aclose(self) -> None:
        if self._done is not None:
            self.state.to("stopped")
            self._done.set()
        if self.recovery is not None:
            await self.recovery.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.checkpointer is not None:
            await self.checkpointer.close()
        if self.reconfigurer is None and self._claimed_on_cluster and not self._scheduler_lost:
            await withdraw_on_cluster(self.client, self.status())
        if self.gateway is not None:
            await self.gateway.stop(w for w in self.reconfigurer.running_on() if w not in self._gone)
            await self.hosts.close()
            if not self._scheduler_lost:
                await self.gateway.publish(self.status())
            await self.gateway.close()
        if self.cluster is not None:
            try:
                await asyncio.wait_for(self.cluster.close(), CLOSE_CLUSTER_S)
            except Exception as exc:
                logger.warning("closing the embedded cluster failed: %s", exc)
        if self._network is not None:
            await asyncio.to_thread(self._network.remove)
        if self._stop_server is not None:
            await self._stop_server.close()


class _Fleet:
    """The :class:`~pescheduler.control.hosts.Fleet` the host manager works on: this deployment's
    Reconfigurer, watchers and state."""

    def __init__(self, dep: Deployment) -> None:
        self.dep = dep

    def placement(self) -> Placement:
        return self.dep.placement()

    def running(self, pe_id: str) -> bool:
        return self.dep.state.pe_state.get(pe_id) == "running"

    async def apply(self, action: Action, timeout: float) -> ApplyRecord:
        return await self.dep.reconfigurer.apply(action, timeout)

    async def add_workers(self, host_id: str, infos: dict[str, dict]) -> None:
        await self.dep.reconfigurer.add_workers(host_id, infos)

    async def remove_workers(self, workers: set[str]) -> None:
        await self.dep.reconfigurer.remove_workers(workers)

    async def watch(self, worker: str, on_lost) -> None:
        await self.dep._watch(worker, on_lost=on_lost)

    async def pe_info(self, worker: str) -> dict:
        return await self.dep.gateway.pe_info(worker)

    def record(self, record: ApplyRecord) -> ApplyRecord:
        return self.dep.reconfigurer.record(record)

    def event(self, kind: str, text: str) -> None:
        self.dep.state.event(kind, text)

    async def fail(self, reason: str) -> None:
        await self.dep._fail(reason)

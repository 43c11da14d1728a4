"""The PE host: a Dask worker plugin that owns the PEs on its worker.

Why a worker plugin driven through custom handlers, and not actors or
long-running tasks: actors are lost with their worker and block
``retire_workers``; long tasks need ``secede()``, cannot be cancelled and lose
their pinning on restart. A worker plugin is installed on every worker,
including ones that join late or restart, and its handlers are reached over
Dask's own RPC (``rpc(worker).pe_deploy(...)``).

Each host also runs a small TCP server for data channels (see channels.py),
bound to the worker's own address (never every interface), TLS when the
worker has Dask TLS certificates, and open only to processes holding a
deployment's secret (handshake.py), which ``pe_secret`` hands over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from time import perf_counter

import cloudpickle
import psutil
from distributed.diagnostics.plugin import WorkerPlugin

from . import handshake, process_settings
from .cgroup import QUOTA_ENV, core_budget, host_quota, machine_id
from .ckpt_files import CheckpointFiles
from .channels import ChannelIn, FrameReceiver, Inbox
from .handover import HandOvers, exported_live
from .handshake import Credentials, tls_contexts
from .lazy_restore import Loader, defer
from .. import allocator, collector
from ..state.base import KeyedState
from ..state.foreground import FOREGROUND
from ..state.incremental import resolve_restore
from ..state.local import LOCAL
from ..state.settings import SPARES, local_copies, remove_stores
from ..plugins import activate
from .dead_outbox import DeadLetterOutbox
from .runtime import Hosting, PERunner
from ..wire import PESpec

logger = logging.getLogger(__name__)

PLUGIN_NAME = "pescheduler"
STOP_TIMEOUT_S = 5.0
HANDLERS = ("pe_info", "pe_secret", "pe_warm", "pe_deploy", "pe_stats", "pe_wait", "pe_drain", "pe_stop",
            "pe_reconf", "pe_reconf_wait", "pe_snapshot", "pe_rewire", "pe_ckpt_begin", "pe_ckpt_wait",
            "pe_ckpt_end", "pe_ckpt_write", "pe_ckpt_progress", "pe_calls")


class PEHostPlugin(WorkerPlugin):
    """Installs a :class:`PEHost` on every worker of the cluster (late joiners included)."""

    name = PLUGIN_NAME
    idempotent = True

    async def setup(self, worker) -> None:
        if PLUGIN_NAME in worker.extensions:
            return
        process_settings.apply()        # the worker process's GIL switch interval and collector (its docstring)
        FOREGROUND.count_loop(asyncio.get_running_loop())   # its work comes before the writer's (state/foreground.py)
        host = PEHost(worker)
        await host.start()
        worker.extensions[PLUGIN_NAME] = host

    async def teardown(self, worker) -> None:
        host = worker.extensions.pop(PLUGIN_NAME, None)
        if host is not None:
            await host.close()


class Changes:
    """A version number bumped whenever one of the host's PEs changes, and waits for the next bump.

    Each wait names the version it looked at, so a change between its look and its wait
    ends it at once. (One shared ``asyncio.Event`` that every wait cleared before looking lost
    changes: a set landing between one wait's look and its ``wait_for`` task's first step was
    wiped by another wait's clear, and the drain of a reconfiguration sat out its timeout;
    tests/unit/test_pehost_waits.py.)
    """

    def __init__(self) -> None:
        self.version = 0
        self._waiters: list[asyncio.Future] = []

    def bump(self) -> None:
        self.version += 1
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def after(self, version: int, timeout: float) -> None:
        """Return once the version is past ``version``, or after ``timeout`` seconds."""
        if self.version > version:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)       # before any await: no bump can slip past
        try:
            await asyncio.wait_for(waiter, max(timeout, 0.0))
        except asyncio.TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)


class Laps:
    """Milliseconds per part of one handler call, and when it began (wall clock): the controller
    keeps them in ``ApplyRecord.steps``, so a slow activation says where its time went."""

    def __init__(self) -> None:
        self.began = time.time()
        self._t = perf_counter()
        self.ms: dict[str, float] = {}
        self.name = ""                  # what the call is about, while it is open (PEHost.calls)

    def lap(self, part: str) -> None:
        now = perf_counter()
        self.ms[part] = round(self.ms.get(part, 0.0) + (now - self._t) * 1000, 3)
        self._t = now

    def answer(self, **more) -> dict:
        return {"began": self.began, "ms": self.ms, **more}

    def so_far(self) -> dict:
        """An open call, for the controller's look at a step that has not answered: its parts
        done, and how long since the last one (where it is now)."""
        return {"call": self.name, "parts": dict(self.ms), "since_ms": round((perf_counter() - self._t) * 1000, 3)}


class PEHost:
    """The PEs of one worker, their data server, and the handlers the controller calls."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.pes: dict[tuple[str, str], PERunner] = {}     # (deployment, pe_id) -> PE
        self.server: asyncio.AbstractServer | None = None
        self.data_address = ""
        self.secrets: dict[str, bytes] = {}          # deployment -> its data-plane secret
        self.outbox = DeadLetterOutbox()             # dead letters handed over, until acknowledged
        self.checkpointing: set[str] = set()         # deployments that take checkpoints
        self.state_backends: dict[str, str] = {}     # deployment -> its keyed-state backend
        self.ckpt_files = CheckpointFiles()          # snapshots held until written to checkpoint storage
        self.calls: dict[int, tuple[str, Laps]] = {}  # id -> (deployment, laps) of deploys and rewires open
        self.client_ssl = None                       # TLS context for channels we open (None: plain)
        self.handovers = HandOvers(self._of, lambda address: self.worker.rpc(address), lambda: self.worker.address,
                                   stop=lambda deployment, pe_ids: self.pe_stop(deployment, pe_ids),
                                   snapshot=self.pe_snapshot)
        self.changes = Changes()             # bumped whenever a PE changes state; the waits below
        self.arrivals = Changes()            # bumped whenever receivers are added (see _expect)
        self.warm_threads: list[ThreadPoolExecutor] = []   # standard slots' threads, started idle
        self.loaders: dict[tuple[str, str], Loader] = {}    # restored PEs built, not started: their key groups
        self.loading: set[asyncio.Task] = set()             # loaders running (lazy_restore.py)
        self._process = psutil.Process()
        self._process.cpu_percent(None)         # start the CPU measurement window
        psutil.cpu_percent(None)
        self._quota = host_quota()               # a lab host: its CPU is its cgroup quota's, not the machine's
        share = os.environ.get(QUOTA_ENV)
        self._share = float(share) if share else None   # this worker's part of a lab host's quota
        self._machine, (self._machine_cores, _) = machine_id(), core_budget()

    async def start(self) -> None:
        ip = self.worker.ip if hasattr(self.worker, "ip") else "127.0.0.1"
        server_ssl, self.client_ssl = tls_contexts(getattr(self.worker, "security", None))
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: FrameReceiver(self._receiver, self._secret_of, self._expect),
                                               host=ip, port=0, ssl=server_ssl)
        port = self.server.sockets[0].getsockname()[1]
        self.data_address = f"{ip}:{port}"
        for name in HANDLERS:
            self.worker.handlers[name] = getattr(self, name)
        self.worker.handlers.update(self.handovers.handlers())

    async def close(self) -> None:
        await self.pe_stop()
        for thread in self.warm_threads:
            thread.shutdown(wait=False)
        if self.server is not None:
            self.server.close()

    def _receiving(self, channel_id: str) -> tuple[str, tuple[Inbox, ChannelIn]]:
        """The deployment whose PE here receives ``channel_id``, and its receiver (KeyError: none)."""
        for (deployment, _pe), pe in self.pes.items():
            try:
                return deployment, pe.receiver(channel_id)
            except KeyError:
                continue
        raise KeyError(f"no PE on {self.worker.address} receives channel {channel_id!r}")

    def _receiver(self, channel_id: str) -> tuple[Inbox, ChannelIn]:
        return self._receiving(channel_id)[1]

    async def _expect(self, channel_id: str) -> tuple[Inbox, ChannelIn]:
        """The receiver of ``channel_id`` once a PE here has it: a reconfiguration deploys PEs and
        adds inputs while their senders already open channels (protocol.execute). Bounded by
        the handshake's time; KeyError after it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + handshake.HANDSHAKE_TIMEOUT_S
        while True:
            looked = self.arrivals.version
            try:
                return self._receiver(channel_id)
            except KeyError:
                if loop.time() >= deadline:
                    raise
            await self.arrivals.after(looked, deadline - loop.time())

    def _secret_of(self, channel_id: str) -> bytes:
        """The secret of the deployment whose PE here receives ``channel_id``, or (a receiver still
        to come, see _expect) whose name the id begins with: ``deployment/epoch/...`` (KeyError: none)."""
        try:
            deployment, _receiver = self._receiving(channel_id)
        except KeyError:
            mine = [d for d in self.secrets if channel_id.startswith(d + "/")]
            if not mine:
                raise
            deployment = max(mine, key=len)
        return self.secrets[deployment]

    def _credentials(self, deployment: str) -> Credentials:
        if deployment not in self.secrets:
            raise RuntimeError(f"deployment {deployment!r} has not handed its secret to {self.worker.address}")
        return Credentials(self.secrets[deployment], self.client_ssl)

    # -- handlers (called by the controller over Dask RPC) -----------------------------
    def _of(self, deployment: str) -> dict[str, PERunner]:
        return {pe_id: pe for (dep, pe_id), pe in self.pes.items() if dep == deployment}

    def pe_info(self) -> dict:
        return {"worker": self.worker.address, "data_address": self.data_address, "pid": os.getpid(),
                "allocator": allocator.in_use(), "pes": [f"{dep}/{pe_id}" for dep, pe_id in sorted(self.pes)]}

    def pe_secret(self, deployment: str, secret: bytes, checkpoint: bool = False, state: str = "memory") -> None:
        """The deployment's data-plane secret (over Dask's RPC: the one channel already trusted),
        whether it takes checkpoints and its keyed-state backend (its operators read them in
        ``context.extra["checkpoint"]`` and ``context.extra["state"]``)."""
        self.secrets[deployment] = bytes(secret)
        self.state_backends[deployment] = state
        if state == "disk":
            SPARES.make_ahead(deployment)       # a store a rescale's pause takes instead of creating one
        if checkpoint:
            self.checkpointing.add(deployment)

    def pe_warm(self, plugins: list[str] = (), slots: int = 0) -> dict:
        """Keep ``slots`` standard slots warm here: every operator plug-in imported, one idle
        thread started per slot (a copy whose operator blocks takes one instead of starting
        its own). A copy placed here then only needs its parameters and state."""
        t0 = perf_counter()
        found = activate(plugins)
        while len(self.warm_threads) < slots:
            thread = ThreadPoolExecutor(1, thread_name_prefix="pe-slot")
            thread.submit(int).result()
            self.warm_threads.append(thread)
        return {"slots": len(self.warm_threads), "operators": len(found.operators),
                "ms": round((perf_counter() - t0) * 1000, 3)}

    async def pe_deploy(self, specs: bytes, plugins: list[str] = (), start: bool = False) -> dict:
        """Build the PEs (not started): receivers exist before any sender connects.

        ``plugins`` are the deployment's ``--plugin`` modules, activated here too.
        ``start``: start them at once, while their output channels open; the call answers once
        they are open (a channel to a receiver not built yet waits for it there, ``_expect``).
        Answers the PEs made and the milliseconds of each part (:class:`Laps`).
        """
        laps = Laps()
        activate(plugins)
        laps.lap("plugins")
        specs = cloudpickle.loads(specs)
        laps.lap("unpickle")
        with self._open(specs[0].deployment if specs else "", laps, f"deploy {','.join(s.pe_id for s in specs)}"):
            return await self._deploy(specs, start, laps)

    async def _deploy(self, specs: list[PESpec], start: bool, laps: Laps) -> dict:
        made = []
        for spec in specs:
            assert isinstance(spec, PESpec)
            if spec.restore:                     # key groups' files read here, checked (incremental.py)
                copies = local_copies(spec.deployment)     # local recovery (state/local.py), unless off
                pending = defer(spec)            # loaded once the PE runs (lazy_restore.py)
                read, here = await asyncio.to_thread(resolve_restore, spec.restore, copies)
                if read:
                    logger.info("PE %s: %d key-group files restored, %d from this worker's copies", spec.pe_id,
                                read, here)
            spare = self.warm_threads.pop() if spec.pe_id in spec.copies and self.warm_threads else None
            pe = PERunner(spec, self._hosting(spec.deployment), spare_thread=spare)
            if spec.restore and pending:
                self.loaders[(spec.deployment, spec.pe_id)] = Loader(pe, pending, copies)
            self.pes[(spec.deployment, spec.pe_id)] = pe
            made.append(spec.pe_id)
        if any(spec.restore for spec in specs):
            collector.freeze_survivors()                         # what their restored state made (pescheduler/collector.py)
        self.arrivals.bump()                     # channels to them that were waiting go on
        laps.lap("build")
        loading = [p for p in made if (spec.deployment, p) in self.loaders]     # restored lazily (lazy_restore.py)
        if start and made:
            await self._start(spec.deployment, made, laps)
        return laps.answer(pes=made, loading=loading)

    def _hosting(self, deployment: str) -> Hosting:
        """What this host gives each PE of ``deployment`` it builds."""
        return Hosting(self.worker.address, self._credentials(deployment), deployment in self.checkpointing,
                       self.state_backends.get(deployment, "memory"), on_change=self._bump)

    async def _start(self, deployment: str, pe_ids: list[str], laps: Laps) -> None:
        """Start the PEs while their output channels open, then wait for those (a channel that
        cannot open fails the call: the PE's data waits in it meanwhile, nothing is lost)."""
        pes = [self.pes[(deployment, pe_id)] for pe_id in pe_ids]
        for pe in pes:
            pe.open_outputs(self._receiver, self.data_address, self._expect)
            self.handovers.adopt(deployment, pe)     # its moved key groups that came before it
            loader = self.loaders.get((deployment, pe.pe_id))
            if loader is not None:
                loader.gate()                       # its restored key groups load once it runs
        for pe in pes:
            pe.start().add_done_callback(lambda _t: self._bump())
            loader = self.loaders.pop((deployment, pe.pe_id), None)
            if loader is not None:
                task = loader.start()
                self.loading.add(task)
                task.add_done_callback(self.loading.discard)
        self._bump()
        laps.lap("start")
        await asyncio.gather(*(pe.opened() for pe in pes))
        laps.lap("connect")

    @property
    def version(self) -> int:
        return self.changes.version

    def _bump(self) -> None:
        self.changes.bump()

    def pe_stats(self, deployment: str, dead_letters: bool = True, acked: tuple | None = None) -> dict:
        """Cumulative counters of the deployment's PEs here, and (``dead_letters``, the monitor's
        call) every dead letter the controller has not acknowledged yet (``acked``: the
        ``(incarnation, seq)`` of the newest it has from this address; another incarnation's
        numbers say nothing of this one's: dead_outbox.py)."""
        dead: list[dict] = []
        pes = self._of(deployment)
        if dead_letters:
            fresh = [{"op": d.operator, "pe": pe.pe_id, "item": _portable(d.item), "error": d.error}
                     for pe in pes.values() for d in pe.take_dead_letters()]
            dead = self.outbox.hand_over(deployment, fresh, acked)
        return {"worker": self.worker.address, "incarnation": self.outbox.incarnation, "version": self.version,
                "process": self._process_stats(), "pes": {pe_id: pe.stats() for pe_id, pe in pes.items()},
                "dead_letters": dead}

    def _process_stats(self) -> dict:
        """This worker's CPU (cores used) and memory since the last call, and what the monitor needs
        to add up the deployment's own CPU per host (``share``: its part of a lab host's quota;
        ``machine``/``machine_cores``: the machine and cores hosts without a quota share), beside
        everything the host runs (``host_cpu``, other tenants included)."""
        return {"cpu": self._process.cpu_percent(None) / 100, "memory_bytes": self._process.memory_info().rss,
                "cores": min(1.0, self._quota.cores) if self._quota else 1.0,      # what one PE here can use
                "share": self._share, "machine": self._machine, "machine_cores": self._machine_cores,
                "host_cpu": self._quota.fraction() if self._quota else psutil.cpu_percent(None) / 100,
                "host_memory": psutil.virtual_memory().percent / 100}

    async def pe_wait(self, deployment: str, version: int, timeout: float) -> dict:
        """Long poll: return when a PE changed state after ``version``, or at ``timeout``."""
        await self.changes.after(version, timeout)
        return {"version": self.version,
                "pes": {pe_id: {"state": pe.state, "error": pe.error}
                        for pe_id, pe in self._of(deployment).items()}}

    # -- reconfiguration (the controller's side is control/protocol.py) ---------------------------
    async def pe_reconf(self, deployment: str, marker: str, hold: dict[str, list[str]], align: list[str],
                        release: list[str] = (), overtake: dict[str, list[str]] | None = None,
                        drain: dict | None = None, carry: list[str] = (),
                        overdraw: dict[str, list[str]] | None = None) -> dict | None:
        """Begin: upstream PEs send ``marker`` and hold the channels into the PEs being replaced
        (``overtake``: ahead of what those channels buffer); those PEs pause their sources and
        align on the marker (``release``: copies going away, whose partials go to their original
        first; ``carry``: those whose key groups all go to gating instances and whose queued
        input goes with them, ``carried_input.py``; ``overdraw``: PE -> its output channels whose
        consumers need the marker only queued, which ship it and what precedes it without credit,
        ``protocol._overdrawn``). Each PE changes between its turns.

        ``drain``: :meth:`pe_reconf_wait`'s arguments (but the deployment and marker): the same
        call then waits, as that one would, for this worker's part of the drain and answers it,
        so the drain's first look is no round trip of its own to this busy loop (a Release at
        10^6 keys waited 8-41 ms for each of its five in the pause). Its ``times`` then also say
        when each PE here held its channels and sent the marker (``"<pe> held"``): what a drain
        waited for before the marker left, against what it waited for after (the record's steps)."""
        pes = self._of(deployment)
        overtake = overtake or {}
        held = {}
        for pe_id, channel_ids in hold.items():
            await pes[pe_id].hold(channel_ids, marker, overtake.get(pe_id, ()))
            held[f"{pe_id} held"] = time.time()
        for pe_id in align:
            await pes[pe_id].align(marker, release=pe_id in release, carry=pe_id in carry,
                                   overdraw=(overdraw or {}).get(pe_id, ()))
        if drain is not None:
            answer = await self.pe_reconf_wait(deployment, marker, **drain)
            answer["times"] = {**held, **answer["times"]}
            return answer
        return None

    async def pe_reconf_wait(self, deployment: str, marker: str, aligned: list[str],
                             seen: dict[str, list[str]], timeout: float,
                             queued: dict[str, list[str]] | None = None) -> dict:
        """Until every PE in ``aligned`` has aligned on ``marker``, every PE in ``seen`` has
        taken it from the listed input channels (all data before it processed) and every PE in
        ``queued`` has it in its inbox from the listed ones (all data before it here, ahead of
        it: a Release's copy may stop, ``protocol.ReconfigurationPlan.late_seen``), or ``timeout``.

        The answer also says how far the drain got: ``progress``, a count that grows with every
        batch those PEs take ahead of the marker, every marker they note and every operator
        that aligns (the controller fails a drain only when it stops growing), and ``times``,
        the wall clock at which each PE aligned and each listed channel delivered the marker.

        Only what lies ahead of the marker counts (``PERunner.alignment_status``, rewirer.py): the PEs
        being replaced take a finite amount (their sources paused, their senders held behind
        the marker), and of a PE that stays only the channels from them; its other inputs flow
        on forever and would make a stuck drain look busy. Shipping counts too: a batch a PE
        being replaced sends, and a batch a PE that stays sends on a *full* channel that a
        listed channel feeds. While that channel is full the PE takes nothing from the listed
        channel (the flow rule, flow.py), so the marker waits behind the full channel's
        backlog, which then only shrinks; with a slow PE downstream granting one credit at a
        time, the listed channel's tuples stood still for 11 s while the backlog went out, and
        the drain failed (issue 20, at load 32).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        queued = queued or {}
        while True:
            looked = self.changes.version      # a change after this look ends the wait below
            pes = self._of(deployment)
            status = {p: pes[p].alignment_status(marker) for p in aligned if p in pes}
            status.update({p: pes[p].alignment_status(marker, [*seen.get(p, ()), *queued.get(p, ())],
                                                      queued.get(p, ()))
                           for p in {*seen, *queued} if p in pes})
            missing = [p if c == "aligned" else f"{p}<-{c}" for p, st in status.items() for c in st["missing"]]
            failed = [pes[p].error for p in aligned if p in pes and pes[p].state == "failed"]
            if not missing or failed or loop.time() >= deadline:
                times = {f"{p} aligned" if c == "aligned" else f"{p}<-{_from(c)}": at
                         for p, st in status.items() for c, at in st["times"].items()}
                times.update({f"{p}<-{_from(c)} queued": at for p, st in status.items()
                              for c, at in st.get("queued", {}).items()})
                return {"missing": missing, "failed": failed, "progress": sum(st["progress"] for st in status.values()),
                        "times": times}
            await self.changes.after(looked, deadline - loop.time())

    async def pe_snapshot(self, deployment: str, pe_ids: list[str], leave_out: list[str] = ()) -> bytes:
        """The aligned PEs' operator states, progress and source positions (cloudpickled), but
        those of the operators ``leave_out`` names (their key groups went to their new owners)."""
        pes = self._of(deployment)
        states = {}
        for pe_id in pe_ids:
            states[pe_id] = await pes[pe_id].aligned_snapshot(leave_out)
        return cloudpickle.dumps(states)

    async def pe_rewire(self, deployment: str, pe_id: str, outputs: bytes = b"",
                        remove_outputs: list[str] = (), add_inputs: bytes = b"",
                        remove_inputs: list[str] = (), edges: bytes = b"", routing: bytes = b"",
                        copies: dict[str, str] | None = None, handover: list[dict] = (),
                        early: bool = False, expect: list[dict] = ()) -> dict:
        """Change a PE that stays: new inputs registered (``edges``: its operators' inputs now),
        held outputs re-pointed, routers re-built (``routing``, ``copies``: copies came or went);
        ``handover``: key-group moves its instances export as its routers switch (handover.py).
        ``early``: before the pause, only register ``add_inputs`` and open ``outputs`` with nothing
        routed to them (``PERunner.open_early``); the call in the pause then switches to them.
        ``expect``: moves whose groups its instances gate first, in this very call, before
        its routers switch (``HandOvers.pe_handover_expect``; a Release's gate and switch were two
        round trips to this worker's loop in the pause).
        Answers the milliseconds of each part (:class:`Laps`)."""
        laps = Laps()
        with self._open(deployment, laps, f"{'open' if early else 'rewire'} {pe_id}"):
            if expect:
                await self.handovers.pe_handover_expect(deployment, list(expect))
                laps.lap("gate")
            if early:
                return await self._open_early(deployment, pe_id, outputs, add_inputs, laps)
            return await self._rewire(deployment, pe_id, outputs, remove_outputs, add_inputs, remove_inputs,
                                      edges, routing, copies, handover, laps)

    async def _rewire(self, deployment, pe_id, outputs, remove_outputs, add_inputs, remove_inputs, edges, routing,
                      copies, handover, laps: Laps) -> dict:
        pe = self._of(deployment)[pe_id]
        parts = []
        await pe.rewire(cloudpickle.loads(outputs) if outputs else [], list(remove_outputs),
                        cloudpickle.loads(add_inputs) if add_inputs else [], list(remove_inputs),
                        cloudpickle.loads(edges) if edges else None, cloudpickle.loads(routing) if routing else None,
                        copies, (self._receiver, self.data_address, self._expect), laps.lap,
                        before=lambda: parts.extend(exported_live(pe, list(handover))))
        if parts:
            await self.handovers.send(deployment, parts)
            laps.lap("handover")
        self.arrivals.bump()                     # channels to the new inputs that were waiting go on
        laps.lap("inputs")
        if pe.opening():                         # none when every new channel opened before the pause
            await pe.opened()                    # outside the turn: the PE goes on meanwhile
            laps.lap("connect")
        return laps.answer()

    async def _open_early(self, deployment, pe_id, outputs, add_inputs, laps: Laps) -> dict:
        pe = self._of(deployment)[pe_id]
        await pe.open_early(cloudpickle.loads(outputs) if outputs else [],
                            cloudpickle.loads(add_inputs) if add_inputs else [],
                            (self._receiver, self.data_address, self._expect))
        self.arrivals.bump()                     # channels to the new inputs that were waiting go on
        laps.lap("inputs")
        await pe.opened_early()                  # outside the turn: the PE goes on meanwhile
        laps.lap("connect")
        return laps.answer()

    @contextmanager
    def _open(self, deployment: str, laps: Laps, name: str):
        """``laps`` is an open call of ``deployment`` named ``name`` until the block ends (pe_calls)."""
        laps.name = name
        self.calls[id(laps)] = (deployment, laps)
        try:
            yield
        finally:
            self.calls.pop(id(laps), None)

    async def pe_calls(self, deployment: str) -> dict:
        """The deployment's deploys and rewires open here, each with its parts done so far: the
        controller looks at them while a step waits for their answers (``protocol._wait_calls``:
        a call that is passing its parts is moving, and one that is not says where it stands)."""
        opening = [f"{pe_id} -> {channel.channel_id}" for (d, pe_id), pe in list(self.pes.items()) if d == deployment
                   for _spec, channel in pe.ports.outs
                   if channel.opening is not None and not channel.opening.done()]
        return {"worker": self.worker.address, "opening": opening,
                "calls": [laps.so_far() for d, laps in list(self.calls.values()) if d == deployment]}

    # -- checkpoints (the controller's side is pescheduler/checkpoint/, the PE's barriers.py) ----
    async def pe_ckpt_begin(self, deployment: str, checkpoint_id: int, pe_ids: list[str], epoch: int) -> None:
        """Start checkpoint ``checkpoint_id`` of ``epoch`` at these PEs (those holding sources): barriers flow on."""
        pes = self._of(deployment)
        for pe_id in pe_ids:
            if pe_id in pes:
                await pes[pe_id].begin_checkpoint(checkpoint_id, epoch)

    async def pe_ckpt_wait(self, deployment: str, checkpoint_id: int, pe_ids: list[str],
                           timeout: float) -> dict:
        """Until every listed PE here has snapshotted for ``checkpoint_id`` (or ``timeout``): their
        results (``{"taken": True}`` or ``{"error": ...}``), taken off the PEs and held until
        :meth:`pe_ckpt_write` (or the checkpoint's end).
        A PE that is gone, or failed, answers with an error."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            looked = self.changes.version
            pes = self._of(deployment)
            gone = [p for p in pe_ids if p not in pes or pes[p].state == "failed"]
            missing = [p for p in pe_ids if p in pes and pes[p].checkpoint_result(checkpoint_id) is None]
            if gone or not missing or loop.time() >= deadline:
                break
            await self.changes.after(looked, deadline - loop.time())
        results = {p: self.ckpt_files.hold(deployment, checkpoint_id, p, result) for p in pe_ids
                   if p in pes and (result := pes[p].checkpoint_result(checkpoint_id, take=True)) is not None}
        results.update({p: {"error": f"PE {p} is gone or failed on {self.worker.address}"} for p in gone})
        return {"results": results, "missing": missing}

    async def pe_ckpt_write(self, deployment: str, checkpoint_id: int, pe_ids: list[str], storage: str) -> dict:
        """Write the held snapshots of ``checkpoint_id`` into ``storage`` (the run's directory), in
        a thread: ``{pe_id: {"files", "positions"} or {"error"}}`` (ckpt_files.py)."""
        return await asyncio.to_thread(self.ckpt_files.write, deployment, checkpoint_id, pe_ids, storage)

    def pe_ckpt_progress(self, deployment: str, checkpoint_id: int) -> dict:
        """How far :meth:`pe_ckpt_write` of ``checkpoint_id`` is: ``{"bytes": n}`` put so far, or
        ``{"bytes": None}`` when no write of it is going on here (the coordinator's watchdog)."""
        return {"bytes": self.ckpt_files.progress(deployment, checkpoint_id)}

    async def pe_ckpt_end(self, deployment: str, checkpoint_id: int, complete: bool) -> None:
        """Checkpoint ``checkpoint_id`` is complete (sinks commit) or aborted (sinks discard, PEs
        still aligning on it go on). The writer's end in a thread, as its write: it walks every
        chain's files and prunes this worker's local copies (a listing and a removal per file), which
        held the worker's loop 70-123 ms at 10^7 keys (traced), every PE on it and every call waiting.
        What the checkpoint let go of is freed after this call's answer, in a thread of its own
        (:meth:`CheckpointFiles.settle`): at the first checkpoints after a fill of 10^7 keys on
        ``disk`` it took 1-3 s beside the PE, and the call timed out (``pescheduler.calls.worker``)."""
        let_go = await asyncio.to_thread(self.ckpt_files.settle, deployment, checkpoint_id, complete)
        try:
            for pe_id, pe in self._of(deployment).items():
                # Stopped while this call waited for its turn (a restore or a reconfiguration
                # replaced it): its successor settles the checkpoint from its own state. A
                # commit here would race the successor's fencing and its read of what was
                # published (a Kafka sink's records of the checkpoint published twice).
                await pe.commit(checkpoint_id, complete, still=lambda key=(deployment, pe_id), pe=pe: self.pes.get(key) is pe)
        finally:                            # (a commit that raised: freed all the same, off the loop)
            asyncio.get_running_loop().run_in_executor(None, let_go).add_done_callback(_logged)

    def pe_drain(self, deployment: str) -> list[str]:
        """End the deployment's sources here as if exhausted: windows fire, sinks flush, PEs finish."""
        drained = []
        for pe in self._of(deployment).values():
            if pe.drain():
                drained.append(pe.pe_id)
        return drained

    async def pe_stop(self, deployment: str | None = None, pe_ids: list[str] | None = None,
                      goes_on: bool = False) -> list[str]:
        """Cancel and remove PEs: the named ones, all of a deployment, or all (host closing).

        A deployment stopped whole is over here (its secret, writer and directory go), unless PEs
        of it were deployed here while this waited for its PEs to end: a recovery stops the old PEs
        for at most ``pescheduler.calls.worker``, a PE may take ``STOP_TIMEOUT_S`` to end, and the
        restore's PEs, deployed meanwhile, use all three. ``goes_on`` (a recovery's stop): the
        directory keeps this worker's checkpoint copies, which the restore's PEs placed here read
        first (local recovery, ``state/local.py``); its stores go."""
        stopped, gone = [], []
        keys = [k for k in self.pes if deployment is None or
                (k[0] == deployment and (pe_ids is None or k[1] in pe_ids))]
        for key in keys:
            pe_id = key[1]
            pe = self.pes.pop(key, None)
            self.loaders.pop(key, None)          # built, never started: its groups are not loaded
            if pe is None:
                continue
            if pe.task is not None and not pe.task.done():
                pe.stop()
                try:
                    await asyncio.wait_for(asyncio.shield(pe.task), STOP_TIMEOUT_S)
                except asyncio.TimeoutError:
                    stack = "".join(traceback.format_stack(pe.task.get_stack()[-1])) if pe.task.get_stack() else ""
                    raise RuntimeError(f"PE {pe_id} did not stop within {STOP_TIMEOUT_S}s; it is at:\n{stack}")
                except (asyncio.CancelledError, Exception):
                    pass
            stopped.append(pe_id)
            gone.append(pe)
        if gone:
            collector.thaw()                     # their cycles are garbage now: the next full collection finds them
        if gone and pe_ids is not None:          # the deployment goes on: its stores stay on disk
            asyncio.get_running_loop().call_soon(retire_states, gone)    # after this call's answer
        if deployment is not None and pe_ids is None and not any(k[0] == deployment for k in self.pes):
            self.secrets.pop(deployment, None)          # the deployment is over here
            self.outbox.forget(deployment)
            self.checkpointing.discard(deployment)
            self.state_backends.pop(deployment, None)
            self.ckpt_files.forget(deployment)
            remove_stores(deployment, keep=(LOCAL,) if goes_on else ())     # its operators' disk state (docs/state.md)
            self.handovers.forget(deployment)
        self._bump()
        return stopped


def _logged(done: asyncio.Future) -> None:
    """A checkpoint's freeing that raised (nothing awaits it): logged, the worker goes on."""
    if not done.cancelled() and done.exception() is not None:
        logger.error("freeing what a checkpoint let go of failed", exc_info=done.exception())


def retire_states(pes: list) -> None:
    """The keyed states of stopped PEs' operators (a reconfiguration's retired PEs), retired
    (``DiskState.retire``): their stores emptied and their flush asked of the disk stores'
    background thread, so the close, wherever the cyclic GC frees them, has no memtable to flush
    (190-235 ms at 5 * 10^5 keys: a Release's retired copy, which had just imported half the keys).
    A state is an operator's attribute (``keyed_state``, ``adopt``), looked for one level down."""
    for pe in pes:
        for op in pe.ops.values():
            for held in list(getattr(op, "__dict__", {}).values()):
                retire = getattr(held, "retire", None)
                if isinstance(held, KeyedState) and retire is not None:
                    try:
                        retire()
                    except Exception:           # its close (the GC's) still removes it
                        logger.warning("retiring the state of %s in %s failed", op, pe.pe_id, exc_info=True)


def _from(channel_id: str) -> str:
    """``dep/epoch/src.port->pe`` as ``src.port``: what a timeline line needs."""
    return channel_id.rsplit("/", 1)[-1].split("->", 1)[0]


def _portable(item):
    """Dead-letter items cross Dask RPC as pickles; an unpicklable one as its repr."""
    try:
        return {"pickle": pickle.dumps(item, protocol=5)}
    except Exception:
        return {"repr": repr(item)}

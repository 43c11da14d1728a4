"""``local``: the embedded resource manager. A host is a group of local Dask worker processes.

It lends up to ``pescheduler.rm.local.hosts`` hosts (``local-1``, ``local-2``,
...), each ``workers-per-host`` single-threaded ``dask worker`` processes
started against the deployment's scheduler (with its TLS certificates when
the cluster uses TLS) and stopped by PID. An optional
*demand* stands for the other users of the cluster, so every path of
borrowing and returning runs on one machine:

* a schedule (a list, or a YAML/JSON file holding one) of entries
  ``{at: 30, want: 2, within: 10}`` (30 s after start, ask for host 2 back
  within 10 s) and ``{at: 90, free: 2}`` (host 2 is free again);
* or an async callable ``demand(control)`` that calls ``await
  control.want(2, within=10)`` and ``control.free(2)`` when it likes.

A wanted host is not lent until it is freed. With ``reclaim-after`` set, a
wanted host still held that long after its deadline is taken back by force
(its workers stopped) and reported lost, as a real cluster manager would.

It lends only what the machine has: the hosts it lends hold no more worker
processes than the cores left over by the workers already running here
(:func:`core_budget`: the CPUs this process may run on, lowered by a cgroup v2
CPU quota), so a borrowed "host" is never just more processes on busy cores.
``oversubscribe: true`` lifts that cap, for demos of borrowing on a small
machine; :meth:`LocalResourceManager.host_budget` says which applies (``status``
shows it under ``resources``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import psutil
import yaml
from dask.utils import parse_timedelta

from .. import allocator, config
from ..dask_client import close_client
from ..resources import Host, HostLost, HostReturnRequested, ResourceManagerUnavailable
from ..worker.cgroup import core_budget
from . import processes
from .workers import named_workers, retire_quietly, start_hosts, tls_flags

logger = logging.getLogger(__name__)


@dataclass
class _Held:
    host: Host
    procs: list[processes.Process] = field(default_factory=list)


def _same_imports() -> dict:
    """Workers import what this process imports (as LocalCluster's spawned workers do) and run on
    the chosen allocator (``pescheduler/allocator.py``), as the embedded cluster's do."""
    return {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **allocator.preload_env()}


def _listen_where(scheduler_address: str) -> list[str]:
    """A scheduler on loopback (the embedded cluster) keeps its hosts' workers on loopback too."""
    host = scheduler_address.split("://", 1)[-1].rsplit(":", 1)[0]
    return ["--host", host, "--dashboard-address", f"{host}:0"] if host.startswith("127.") else []


def _here(address: str) -> bool:
    """Whether a worker address is on this machine (loopback, or one of its own addresses)."""
    host = address.rsplit("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    own = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return host.startswith("127.") or host in {"::1", "localhost", socket.gethostname()} | own


def load_schedule(demand) -> list[dict]:
    """A demand schedule from a list, or a ``.yaml``/``.yml``/``.json`` file, sorted by time."""
    if isinstance(demand, str):
        with open(demand) as f:
            entries = json.load(f) if demand.endswith(".json") else yaml.safe_load(f)
    else:
        entries = list(demand)
    for e in entries:
        if "at" not in e or not ({"want", "free"} & set(e)):
            raise ValueError(f"demand entry {e!r}: needs 'at' and one of 'want' or 'free'")
    return sorted(entries, key=lambda e: float(e["at"]))


class LocalResourceManager:
    """Hosts made of local ``dask worker`` processes, within a budget; see the module docstring."""

    name = "local"

    def __init__(self, scheduler_address: str, settings: dict | None = None, security=None) -> None:
        s = config.section("rm.local", settings)      # defaults: pescheduler.yaml only
        self.scheduler_address = scheduler_address
        self.security = security                      # distributed.Security of a TLS cluster, or None
        self.budget = int(s["hosts"])
        self.workers_per_host = int(s["workers-per-host"])
        self.start_timeout = parse_timedelta(s["start-timeout"], default="seconds")
        self.reclaim_after = s["reclaim-after"]
        self.oversubscribe = bool(s["oversubscribe"])
        self.cores, self.cores_from = core_budget()
        self.workers_here = 0                    # workers on this machine not started by us (at start)
        self.demand = s["demand"]
        self.ids = [f"local-{i}" for i in range(1, self.budget + 1)]
        self.held: dict[str, _Held] = {}
        self.wanted: set[str] = set()
        self._due: dict[str, float] = {}          # wanted while starting: host -> its deadline
        self._on_event: Callable[..., Awaitable[None]] | None = None
        self._client = None
        self._tasks: list[asyncio.Task] = []
        self._tls_dir = tempfile.mkdtemp(prefix="pescheduler-local-rm-") if security is not None else None
        self.t0 = time.monotonic()

    # -- the ResourceManager protocol ---------------------------------------------------
    async def start(self, on_event) -> None:
        from distributed import Client

        self._on_event = on_event
        try:
            self._client = await Client(self.scheduler_address, asynchronous=True, timeout=10,
                                        set_as_default=False, security=self.security)
        except OSError as exc:
            raise ResourceManagerUnavailable(f"local: cannot reach the scheduler {self.scheduler_address}: {exc}")
        # asked of the scheduler now: the client's cached scheduler_info() can predate the workers'
        # registration and said 0, so a 2-core machine running 2 workers lent 2 more "hosts"
        info = await self._client.scheduler.identity()
        self.workers_here = sum(1 for addr in info.get("workers", {}) if _here(addr))
        self.t0 = time.monotonic()
        if callable(self.demand):
            self._tasks.append(asyncio.create_task(self._run_callable(self.demand)))
        elif self.demand:
            self._tasks.append(asyncio.create_task(self._run_schedule(load_schedule(self.demand))))

    def lendable(self) -> int:
        return len(self._free())

    def _free(self) -> list[str]:
        """Hosts that may be lent now: not held, not wanted, and (unless oversubscribing)
        within the cores the workers already here leave."""
        free = [h for h in self.ids if h not in self.held and h not in self.wanted]
        if self.oversubscribe:
            return free
        spare = self.cores - self.workers_here - self.workers_per_host * len(self.held)
        return free[:max(0, spare // self.workers_per_host)]

    def host_budget(self) -> dict:
        """The host budget as ``status`` shows it: cores here, where that figure comes from,
        worker processes using them, and how many hosts may still be lent."""
        return {"cores": self.cores, "cores_from": self.cores_from, "workers_here": self.workers_here,
                "workers_lent": self.workers_per_host * len(self.held), "workers_per_host": self.workers_per_host,
                "hosts": self.budget, "lendable": self.lendable(), "oversubscribe": self.oversubscribe}

    async def request_hosts(self, n: int) -> list[Host]:
        free = self._free()[:max(0, n)]
        return await start_hosts(self._start_host, free)

    async def return_host(self, host: Host) -> None:
        held = self.held.pop(host.host_id, None)
        if held is None:
            return
        await retire_quietly(self._client, held.host, "local")
        for proc in held.procs:
            if not await proc.wait_exit(5.0):
                await proc.astop()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for host_id in list(self.held):
            await self.return_host(self.held[host_id].host)
        if self._client is not None:
            await close_client(self._client, config.get_seconds("calls.scheduler"))
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)

    # -- hosts ---------------------------------------------------------------------------
    def host_id(self, ref) -> str:
        """``2``, ``"2"`` or ``"local-2"`` -> ``"local-2"``."""
        text = str(ref)
        return text if text.startswith("local-") else f"local-{text}"

    async def _start_host(self, host_id: str) -> Host | None:
        names = [f"{host_id}-w{i}" for i in range(self.workers_per_host)]
        procs = [processes.start(name, [sys.executable, "-m", "distributed.cli.dask_worker",
                                        self.scheduler_address, "--nthreads", "1", "--no-nanny",
                                        "--no-dashboard", "--name", name, "--death-timeout", "30",
                                        *_listen_where(self.scheduler_address),
                                        *tls_flags(self.security, self._tls_dir)],
                                 env=_same_imports())
                 for name in names]
        self.held[host_id] = _Held(Host(host_id), procs)         # reserved while it starts

        def gone() -> str | None:
            dead = [p for p in procs if not p.alive()]
            return dead and f"worker {dead[0].name} exited ({dead[0].popen.returncode}): {dead[0].log_tail(5)}"
        try:
            found = await named_workers(self._client, names, self.start_timeout, gone)
        except (RuntimeError, TimeoutError, OSError) as exc:
            logger.warning("local: host %s did not start: %s", host_id, exc)
            self.held.pop(host_id, None)
            self._due.pop(host_id, None)
            await asyncio.gather(*(p.astop() for p in procs))
            return None
        host = Host(host_id, tuple(found[n] for n in names), {"pids": [p.pid for p in procs]})
        self.held[host_id] = _Held(host, procs)
        due = self._due.pop(host_id, None)
        if due is not None and host_id in self.wanted:
            self._tasks.append(asyncio.create_task(self._ask_back(host, due)))
        return host

    # -- external demand --------------------------------------------------------------------
    async def want(self, ref, within: float) -> None:
        """Another user wants host ``ref`` within ``within`` seconds: ask for it back if held."""
        host_id = self.host_id(ref)
        self.wanted.add(host_id)
        deadline = time.time() + float(within)
        held = self.held.get(host_id)
        if held is None:
            return
        if not held.host.workers:                 # still starting: asked back once it has started
            self._due[host_id] = deadline
            return
        await self._ask_back(held.host, deadline)

    async def _ask_back(self, host: Host, deadline: float) -> None:
        await self._on_event(HostReturnRequested(host, deadline))
        if self.reclaim_after is not None:
            self._tasks.append(asyncio.create_task(self._reclaim(host.host_id, deadline)))

    def free(self, ref) -> None:
        """Host ``ref`` is free again: it may be lent."""
        self.wanted.discard(self.host_id(ref))
        self._due.pop(self.host_id(ref), None)

    async def _reclaim(self, host_id: str, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.time()) + float(self.reclaim_after))
        held = self.held.get(host_id)
        if held is None or host_id not in self.wanted:
            return
        self.held.pop(host_id, None)
        await asyncio.gather(*(p.astop() for p in held.procs))
        await self._on_event(HostLost(held.host, "taken back by the local resource manager: "
                                                 "not returned by its deadline"))

    async def _run_schedule(self, entries: list[dict]) -> None:
        for entry in entries:
            await asyncio.sleep(max(0.0, self.t0 + float(entry["at"]) - time.monotonic()))
            try:
                if "want" in entry:
                    await self.want(entry["want"], float(entry.get("within", 10)))
                else:
                    self.free(entry["free"])
            except Exception:
                logger.exception("local: demand entry %r failed", entry)

    async def _run_callable(self, demand) -> None:
        try:
            result = demand(self)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("local: the demand callable failed")

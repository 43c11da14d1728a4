"""``lab``: hosts that are real isolated hosts on this machine, for measuring elasticity honestly.

Each lent host ``lab-I`` is a Linux network namespace on the lab's bridge,
with its own address (``10.213.N.(I+1)``), a cgroup CPU quota of
``pescheduler.rm.lab.cpu`` cores, optional ``tc netem`` delay and loss on its
link, and ``ceil(cpu)`` single-threaded ``dask worker`` processes started
inside it (``ip netns exec``) that join the deployment's scheduler. Borrowing
a host adds exactly its quota; returning one (after the host manager has
moved its PEs off) stops its workers by PID and deletes the namespace and
cgroup it created, by name (:mod:`.lab_net`; ``atexit`` too, so a crash
leaves nothing).

The scheduler must be reachable from the namespaces: with ``rm="lab"`` the
embedded cluster listens on the bridge's address instead of 127.0.0.1
(:meth:`LabResourceManager.cluster_network`, called by ``deploy`` before the
cluster starts). The bridge has no port to the outside, so nothing beyond
this machine reaches the deployment; other deployments stay on loopback.

It needs root, ``ip`` (iproute2), a cgroup CPU controller (v2 ``cpu.max`` or
v1 ``cpu.cfs_quota_us``), and ``tc`` with netem for delay or loss; without
them it starts unavailable, with a message naming what is missing (the app
runs on the hosts it holds).
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

from dask.utils import parse_timedelta

from .. import config
from ..dask_client import close_client
from ..resources import Host, ResourceManagerUnavailable
from . import lab_net, processes
from ..worker.cgroup import QUOTA_ENV
from .local import _same_imports
from .workers import named_workers, retire_quietly, start_hosts, tls_flags

logger = logging.getLogger(__name__)


@dataclass
class _LabHost:
    host: Host
    namespace: lab_net.Namespace
    group: lab_net.CpuGroup
    procs: list[processes.Process] = field(default_factory=list)


def _settings(settings: dict | None) -> dict:
    s = config.section("rm.lab", settings)       # defaults: pescheduler.yaml only
    return {**s, "delay_ms": parse_timedelta(s["delay"], default="ms") * 1000, "loss_pct": float(s["loss"])}


class LabResourceManager:
    """Hosts that are network namespaces with a CPU quota each; see the module docstring."""

    name = "lab"

    def __init__(self, scheduler_address: str, settings: dict | None = None, security=None) -> None:
        s = _settings(settings)
        self.scheduler_address = scheduler_address
        self.security = security                      # distributed.Security of a TLS cluster, or None
        # the certificates as files for the workers' command line (removed on close)
        self._tls_dir = tempfile.mkdtemp(prefix="pescheduler-lab-rm-") if security is not None else None
        self.budget = int(s["hosts"])
        self.cpu = float(s["cpu"])
        self.delay_ms, self.loss_pct = s["delay_ms"], s["loss_pct"]
        self.start_timeout = parse_timedelta(s["start-timeout"], default="seconds")
        self.network = lab_net.NETWORKS.get(scheduler_address.split("://", 1)[-1].rsplit(":", 1)[0])
        self.held: dict[str, _LabHost] = {}
        self._client = None

    # -- before the cluster starts ----------------------------------------------------------
    @classmethod
    def cluster_network(cls, settings: dict | None = None) -> lab_net.LabNetwork | None:
        """The bridge the embedded cluster listens on (made now; its ``remove()`` is called once
        the cluster has closed), or None when the lab cannot run here (``start`` then says why)."""
        s = _settings(settings)
        if lab_net.missing(bool(s["delay_ms"] or s["loss_pct"])):
            return None
        return lab_net.LabNetwork(s["subnet"]).create()

    # -- the ResourceManager protocol ---------------------------------------------------
    async def start(self, on_event) -> None:
        from distributed import Client

        lacks = await asyncio.to_thread(lab_net.missing, bool(self.delay_ms or self.loss_pct))
        if lacks:
            raise ResourceManagerUnavailable("lab: this machine lacks " + "; ".join(lacks))
        if self.network is None:
            raise ResourceManagerUnavailable(
                f"lab: the scheduler {self.scheduler_address} is not on a lab network, so the lab's "
                f"namespaces cannot reach it; deploy with the embedded cluster and rm='lab' (it then "
                f"listens on the lab's bridge)")
        try:
            self._client = await Client(self.scheduler_address, asynchronous=True, timeout=10,
                                        set_as_default=False, security=self.security)
        except OSError as exc:
            raise ResourceManagerUnavailable(f"lab: cannot reach the scheduler {self.scheduler_address}: {exc}")

    def lendable(self) -> int:
        return max(0, self.budget - len(self.held))

    def host_budget(self) -> dict:
        """What ``status`` shows under ``resources``: the lab's hosts and what each one is."""
        net = self.network
        return {"hosts": self.budget, "held": len(self.held), "lendable": self.lendable(),
                "cpu_per_host": self.cpu, "workers_per_host": max(1, math.ceil(self.cpu)),
                "delay_ms": self.delay_ms, "loss_pct": self.loss_pct,
                "bridge": f"{net.name} {net.address}/24" if net else None,
                "addresses": {h: lh.namespace.address for h, lh in self.held.items()}}

    async def request_hosts(self, n: int) -> list[Host]:
        ids = [f"lab-{i}" for i in range(1, self.budget + 1) if f"lab-{i}" not in self.held][:max(0, n)]
        return await start_hosts(self._start_host, ids)

    async def return_host(self, host: Host) -> None:
        held = self.held.pop(host.host_id, None)
        if held is None:
            return
        await retire_quietly(self._client, held.host, "lab")
        await self._remove(held)

    async def close(self) -> None:
        for held in list(self.held.values()):
            await self.return_host(held.host)
        if self._client is not None:
            await close_client(self._client, config.get_seconds("calls.scheduler"))
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)

    # -- hosts ---------------------------------------------------------------------------
    async def _start_host(self, host_id: str) -> Host | None:
        index = int(host_id.rsplit("-", 1)[1])
        ns = lab_net.Namespace(self.network, index, self.network.next_address(), self.delay_ms, self.loss_pct)
        group = lab_net.CpuGroup(f"pescheduler-{ns.name}", self.cpu)
        held = self.held[host_id] = _LabHost(Host(host_id), ns, group)     # reserved while it starts
        try:
            await asyncio.to_thread(ns.create)
            await asyncio.to_thread(group.create)
            names = [f"{host_id}-w{i}" for i in range(max(1, math.ceil(self.cpu)))]
            for name in names:
                held.procs.append(self._worker(name, ns, self.cpu / len(names)))
                group.add(held.procs[-1].pid)
            found = await named_workers(self._client, names, self.start_timeout, lambda: _gone(held.procs))
        except (RuntimeError, TimeoutError, OSError) as exc:
            logger.warning("lab: host %s did not start: %s", host_id, exc)
            self.held.pop(host_id, None)
            await self._remove(held)
            return None
        except BaseException:             # cancelled while starting: remove what was made, then go
            self.held.pop(host_id, None)
            await asyncio.shield(self._remove(held))
            raise
        held.host = Host(host_id, tuple(found[n] for n in names),
                         {"pids": [p.pid for p in held.procs], "namespace": ns.name, "address": ns.address,
                          "cgroup": group.name, "cpu": self.cpu})
        return held.host

    def _worker(self, name: str, ns: lab_net.Namespace, cores: float) -> processes.Process:
        """A worker inside ``ns``; told its share of the quota (it cannot read the cgroup: ``ip netns
        exec`` gives it a fresh ``/sys``), so the host's CPU is reported against the quota."""
        cmd = [sys.executable, "-m", "distributed.cli.dask_worker", self.scheduler_address, "--nthreads", "1",
               "--no-nanny", "--no-dashboard", "--host", ns.address, "--name", name, "--death-timeout", "30",
               *tls_flags(self.security, self._tls_dir)]
        return processes.start(name, ns.command(cmd), env={**_same_imports(), QUOTA_ENV: str(cores)})

    async def _remove(self, held: _LabHost) -> None:
        """Stop the host's workers by PID, then delete its cgroup and namespace by name."""
        await asyncio.gather(*(p.astop() for p in held.procs))
        await asyncio.to_thread(held.group.remove)
        await asyncio.to_thread(held.namespace.remove)


def _gone(procs: list[processes.Process]) -> str | None:
    dead = [p for p in procs if not p.alive()]
    return dead and f"worker {dead[0].name} exited ({dead[0].popen.returncode}): {dead[0].log_tail(5)}"

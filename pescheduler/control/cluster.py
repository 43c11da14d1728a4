"""The embedded Dask cluster ``deploy`` starts when no ``--cluster`` is given.

One object owns it: start, grow by one worker (the cold path when no warm slot
is left), close. A deployment on someone else's cluster has none, so code that
may grow the cluster asks whether it holds an :class:`EmbeddedCluster`.

Why not ``LocalCluster``: its worker processes are started with
multiprocessing's *spawn*, which re-imports the caller's ``__main__``. A
script that calls ``pescheduler.deploy(...)`` without an
``if __name__ == "__main__":`` guard then deploys again in every worker and
fails with pages of "Nanny failed to start". Here the scheduler runs in this
process (as in ``LocalCluster``) and each worker is a ``dask worker --no-nanny``
process, so it imports only distributed and pescheduler; apps travel by
value (cloudpickle) as before. Workers are forked from one process that has
imported both already (:mod:`pescheduler.control.forkserver`, one per deploying
process, kept from one embedded cluster to the next): a deploy's workers start
in a fraction of the time and CPU of one import each. Workers are
started and stopped by PID (:mod:`pescheduler.resource_managers.processes`),
in their own session so a terminal's Ctrl-C reaches only the deploying
process, which drains and then stops them. Everything listens on 127.0.0.1.

``security`` (a ``distributed.Security``, or ``True`` for throw-away
certificates) makes every connection TLS, the PE data plane included
(docs/security.md); the workers get the same certificates as files in the
cluster's private temporary folder.

``host`` moves the scheduler and workers off loopback onto one address of
this machine, for a resource manager whose hosts live in network namespaces
(the ``lab``'s bridge: reachable from its namespaces, from nowhere else).
Dashboards stay on loopback unless ``pescheduler.cluster.dashboard`` asks for another address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from functools import partial
from importlib import import_module
from typing import AsyncContextManager, Callable

import dask.config
from distributed import Client, Scheduler, Security
from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.utils import silence_logging_cmgr

from .. import config, dashboard
from . import forkserver
from .isolation import in_thread
from ..resource_managers import processes
from ..resource_managers.workers import named_workers, tls_flags

HOST = "127.0.0.1"
DEATH_TIMEOUT_S = 30       # a worker whose deploying process died (SIGKILL) exits by itself after this
# Dask's dashboard pages imported in steps of at most about 120 ms of CPU each on a quiet machine
# (``python -X importtime``, bokeh 3: bokeh.models.axes is the largest), 0.7-1.0 s in all; the last
# is the module that connects them (EmbeddedCluster.attach_dashboard)
DASHBOARD_STEPS = ("bokeh.core.properties", "bokeh.models.renderers", "bokeh.models.axes", "bokeh.models.plots",
                   "bokeh.models.map_plots", "bokeh.models.widgets", "bokeh.models", "bokeh.plotting",
                   "distributed.dashboard.components.scheduler", "distributed.dashboard.scheduler")


def worker_args(scheduler: str, name: str, tls: list[str] = (), host: str = HOST) -> list[str]:
    """``dask worker`` arguments: single-threaded, no nanny, called ``name``, joining ``scheduler``."""
    return [scheduler, "--nthreads", "1", "--no-nanny", "--no-dashboard", "--dashboard-address", f"{HOST}:0",
            "--host", host, "--name", name, "--death-timeout", str(DEATH_TIMEOUT_S), *tls]


def _import_bokeh(name: str):
    """One of :data:`DASHBOARD_STEPS`, imported while no other thread imports or renders with bokeh."""
    with dashboard.BOKEH_LOCK:
        return import_module(name)


class _Joins(SchedulerPlugin):
    """Sets ``event`` as a worker joins the in-process scheduler (on its loop, the deployment's):
    the wait for the cluster's workers reads the scheduler then, not at its next poll."""

    name = "pescheduler-joins"

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def add_worker(self, scheduler: Scheduler, worker: str) -> None:
        self.event.set()


class EmbeddedCluster:
    """An in-process scheduler (with its dashboard) and single-threaded worker processes on 127.0.0.1
    (or ``host``)."""

    def __init__(self, n_workers: int, security: Security | bool | None = None, host: str = HOST) -> None:
        self.n_workers = n_workers
        self.host = host
        self.security = Security.temporary() if security is True else security or None
        self._scheduler: Scheduler | None = None
        self._joins = _Joins()
        self._dashboard_host = HOST
        self._workers: list[processes.Process] = []
        self._log_dir = tempfile.mkdtemp(prefix="pescheduler-cluster-")
        self._forks: forkserver.ForkServer | None = None
        self._named = 0
        self._quiet = contextlib.ExitStack()

    @property
    def scheduler_address(self) -> str:
        assert self._scheduler is not None, "the embedded cluster is not started"
        return self._scheduler.address

    @property
    def dashboard_link(self) -> str:
        """``http://127.0.0.1:PORT/status``: the scheduler's dashboard (pages need bokeh installed)."""
        return f"http://{self._dashboard_host}:{self._scheduler.http_server.port}/status"

    async def start(self) -> str:
        """Start the scheduler and ``n_workers`` worker processes; the scheduler's address."""
        # As LocalCluster does: the scheduler's INFO lines would bury the live view.
        self._quiet.enter_context(silence_logging_cmgr(logging.WARNING))
        # Asked first: a new server's imports overlap the scheduler's start.
        self._forks = forkserver.shared()
        # The /pescheduler page through the dashboard's own extension point (no second server).
        routes = [*dask.config.get("distributed.scheduler.http.routes"), "pescheduler.dashboard"]
        with dask.config.set({"distributed.scheduler.http.routes": routes}):
            dashboard_address = config.get("cluster.dashboard")
            host = dashboard_address.rsplit(":", 1)[0].strip("[]")
            self._dashboard_host = HOST if host in ("", "0.0.0.0", "::") else host    # where a browser here goes
            # dashboard=False: the HTTP server (with the /pescheduler page) starts now, Dask's bokeh
            # pages later (attach_dashboard): importing bokeh costs about 0.3 s of every deploy.
            self._scheduler = await Scheduler(host=self.host, port=0, dashboard_address=dashboard_address,
                                              dashboard=False, validate=False, security=self.security,
                                              protocol="tls" if self.security else None)
        dashboard.install(self._scheduler)
        self._scheduler.add_plugin(self._joins)
        for _ in range(self.n_workers):
            await self._spawn()
        return self._scheduler.address

    async def attach_dashboard(self, step: Callable[[], AsyncContextManager], wait_s: float) -> None:
        """Add Dask's bokeh pages (``/status`` and the rest) to the running scheduler's HTTP server.

        bokeh is imported in :data:`DASHBOARD_STEPS`, each in a daemon thread inside ``step()`` (the
        reconfiguration lock: deployment.py), so a reconfiguration or checkpoint asked meanwhile
        waits for one step, not the whole import: held whole, beside a loaded suite the import held
        the lock 12-14 s and a policy's first Replicate waited that long (session 81). A step not
        done within ``wait_s`` leaves the lock and the pages are not attached (a process that is
        exiting never waits for a daemon thread). The pages are connected on the scheduler's loop
        once imported, if the scheduler still runs; without bokeh installed the server answers them
        with Dask's "install bokeh" page, as before. Once per cluster; a no-op without a scheduler.
        """
        if self._scheduler is None or self._dashboard_begun:
            return
        self._dashboard_begun = True
        scheduler, module = self._scheduler, None
        for name in DASHBOARD_STEPS:
            async with step():
                try:
                    module = await asyncio.wait_for(in_thread(partial(_import_bokeh, name), "pescheduler-dashboard-import"),
                                                    wait_s)
                except asyncio.TimeoutError:
                    logger.warning("importing %s for Dask's dashboard pages took over %g s: not attached", name, wait_s)
                    return
                except ImportError:         # no bokeh (the last step says so), or a step this bokeh lacks
                    module = None
        if scheduler.status != Status.running:
            return
        if module is None:
            from distributed.http.utils import get_handlers

            scheduler.http_application.add_handlers(r".*", get_handlers(
                server=scheduler, modules=["distributed.http.scheduler.missing_bokeh"], prefix="/"))
        else:
            module.connect(scheduler.http_application, scheduler.http_server, scheduler, prefix="/")

    _dashboard_begun = False

    async def _spawn(self) -> processes.Process:
        """Fork one worker; its stdout is ours (a ``print`` sink shows where the user looks, as with
        LocalCluster), its log lines (stderr) go to ``log_dir/NAME.log``."""
        name = f"embedded-{self._named}"
        self._named += 1                   # before the first spawn waits for the server to be ready
        log_path = os.path.join(self._log_dir, f"{name}.log")
        args = worker_args(self._scheduler.address, name, tls_flags(self.security, self._log_dir), self.host)
        proc = processes.Process(name, await asyncio.to_thread(self._forks.spawn, args, log_path), log_path)
        self._workers.append(proc)
        return proc

    async def wait_for_workers(self, client: Client) -> None:
        """Until the workers started with the cluster have joined (``pescheduler.cluster.start-timeout``)."""
        await self._joined(client, self._workers)

    async def grow(self, client: Client) -> None:
        """Start one more worker and wait until it has joined."""
        await self._joined(client, [await self._spawn()])

    async def _joined(self, client: Client, procs: list[processes.Process]) -> None:
        def gone() -> str | None:
            dead = [p for p in procs if not p.alive()]
            return dead and (f"embedded worker {dead[0].name} exited with {dead[0].popen.returncode}:\n"
                             f"{dead[0].log_tail(10)}")
        await named_workers(client, [p.name for p in procs], config.get_seconds("cluster.start-timeout"),
                            gone, self._joins.event)

    async def close(self) -> None:
        """Stop every worker process by PID (SIGTERM, then SIGKILL), then the scheduler."""
        await asyncio.gather(*(p.astop() for p in self._workers))
        if self._scheduler is not None:
            await self._scheduler.close()
        self._quiet.close()
        shutil.rmtree(self._log_dir, ignore_errors=True)

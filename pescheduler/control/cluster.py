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
process started by command line, so it imports only distributed and
pescheduler; apps travel by value (cloudpickle) as before. Workers are
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
import subprocess
import sys
import tempfile

import dask.config
from distributed import Client, Scheduler, Security
from distributed.utils import silence_logging_cmgr

from .. import config, dashboard
from ..resource_managers import processes
from ..resource_managers.workers import named_workers, tls_flags

HOST = "127.0.0.1"
DEATH_TIMEOUT_S = 30       # a worker whose deploying process died (SIGKILL) exits by itself after this


def worker_process(scheduler: str, name: str, log_dir: str, tls: list[str] = (),
                   host: str = HOST) -> processes.Process:
    """A single-threaded ``dask worker`` called ``name`` joining ``scheduler``, started by command line.

    Its stdout is ours (a ``print`` sink shows where the user looks, as with
    LocalCluster); its log lines (stderr) go to ``log_dir/name.log``.
    """
    cmd = [sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--nthreads", "1", "--no-nanny",
           "--no-dashboard", "--dashboard-address", f"{HOST}:0", "--host", host, "--name", name, "--death-timeout", str(DEATH_TIMEOUT_S), *tls]
    log_path = os.path.join(log_dir, f"{name}.log")
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(cmd, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    return processes.Process(name, popen, log_path)


class EmbeddedCluster:
    """An in-process scheduler (with its dashboard) and single-threaded worker processes on 127.0.0.1
    (or ``host``)."""

    def __init__(self, n_workers: int, security: Security | bool | None = None, host: str = HOST) -> None:
        self.n_workers = n_workers
        self.host = host
        self.security = Security.temporary() if security is True else security or None
        self._scheduler: Scheduler | None = None
        self._dashboard_host = HOST
        self._workers: list[processes.Process] = []
        self._log_dir = tempfile.mkdtemp(prefix="pescheduler-cluster-")
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
        # The /pescheduler page through the dashboard's own extension point (no second server).
        routes = [*dask.config.get("distributed.scheduler.http.routes"), "pescheduler.dashboard"]
        with dask.config.set({"distributed.scheduler.http.routes": routes}):
            dashboard_address = config.get("cluster.dashboard")
            host = dashboard_address.rsplit(":", 1)[0].strip("[]")
            self._dashboard_host = HOST if host in ("", "0.0.0.0", "::") else host    # where a browser here goes
            self._scheduler = await Scheduler(host=self.host, port=0, dashboard_address=dashboard_address,
                                              validate=False, security=self.security,
                                              protocol="tls" if self.security else None)
        dashboard.install(self._scheduler)
        for _ in range(self.n_workers):
            self._spawn()
        return self._scheduler.address

    def _spawn(self) -> processes.Process:
        proc = worker_process(self._scheduler.address, f"embedded-{len(self._workers)}", self._log_dir,
                              tls_flags(self.security, self._log_dir), self.host)
        self._workers.append(proc)
        return proc

    async def wait_for_workers(self, client: Client) -> None:
        """Until the workers started with the cluster have joined (``pescheduler.cluster.start-timeout``)."""
        await self._joined(client, self._workers)

    async def grow(self, client: Client) -> None:
        """Start one more worker and wait until it has joined."""
        await self._joined(client, [self._spawn()])

    async def _joined(self, client: Client, procs: list[processes.Process]) -> None:
        def gone() -> str | None:
            dead = [p for p in procs if not p.alive()]
            return dead and (f"embedded worker {dead[0].name} exited with {dead[0].popen.returncode}:\n"
                             f"{dead[0].log_tail(10)}")
        await named_workers(client, [p.name for p in procs], config.get_seconds("cluster.start-timeout"),
                            gone)

    async def close(self) -> None:
        """Stop every worker process by PID (SIGTERM, then SIGKILL), then the scheduler."""
        await asyncio.gather(*(p.astop() for p in self._workers))
        if self._scheduler is not None:
            await self._scheduler.close()
        self._quiet.close()
        shutil.rmtree(self._log_dir, ignore_errors=True)

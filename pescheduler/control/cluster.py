"""The embedded Dask cluster ``deploy`` starts when no ``--cluster`` is given.

One object owns it: start, grow by one worker (the cold path when no warm slot
is left), close. A deployment on someone else's cluster has none, so code that
may grow the cluster asks whether it holds an :class:`EmbeddedCluster`.
"""

from __future__ import annotations

import logging

from distributed import Client, LocalCluster, Security


LOOPBACK = "127.0.0.1"


class EmbeddedCluster:
    """A ``LocalCluster`` of single-threaded worker processes on 127.0.0.1.

    Everything it opens (scheduler, nannies, workers, dashboard, PE data
    servers) listens on loopback only: nobody on the network can reach it.
    ``security``: a ``distributed.Security`` (or ``True``: throw-away
    certificates) makes every connection TLS, against other users of this host.
    """

    def __init__(self, n_workers: int, security=None) -> None:
        self.n_workers = n_workers
        self.security = Security.temporary() if security is True else security
        self._cluster: LocalCluster | None = None

    @property
    def scheduler_address(self) -> str:
        assert self._cluster is not None, "the embedded cluster is not started"
        return self._cluster.scheduler_address

    async def start(self) -> str:
        """Start the scheduler and ``n_workers`` workers; the scheduler's address."""
        self._cluster = await LocalCluster(
            n_workers=self.n_workers, threads_per_worker=1, processes=True, asynchronous=True,
            host=LOOPBACK, dashboard_address=f"{LOOPBACK}:0", silence_logs=logging.WARNING,
            security=self.security)
        return self._cluster.scheduler_address

    async def wait_for_workers(self, client: Client) -> None:
        """Until the workers started with the cluster have joined (60 s at most)."""
        await client.wait_for_workers(self.n_workers, timeout=60)

    async def grow(self, client: Client) -> None:
        """Start one more worker and wait until it has joined."""
        self._cluster.scale(len(self._cluster.worker_spec) + 1)
        await client.wait_for_workers(len(self._cluster.worker_spec), timeout=60)

    async def close(self) -> None:
        if self._cluster is not None:
            await self._cluster.close()

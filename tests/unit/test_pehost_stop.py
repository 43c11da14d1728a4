"""The PE host's stop of a whole deployment, and a restore's PEs deployed while it waits.

A recovery stops every old PE, waits ``pescheduler.calls.worker`` (3 s) at most, then deploys
the restored PEs; a PE may take up to ``STOP_TIMEOUT_S`` (5 s) to end. A stop that ended after
the restore's deploy removed what the new PEs use: the deployment's secret and its directory on
the worker (their stores, the files a lazy restore makes ready, the checkpoint copies).
"""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import dask.config

from pescheduler.state.settings import deployment_dir, store_dir
from pescheduler.worker.pehost import PEHost


def _slow_pe(ended: asyncio.Event) -> SimpleNamespace:
    """A PE whose task ends only once ``ended`` is set, however it is asked to stop."""
    return SimpleNamespace(task=asyncio.ensure_future(ended.wait()), stop=lambda: None)


def test_a_restores_pes_deployed_while_the_old_ones_stop_keep_the_deployments_secret_and_stores(tmp_path):
    async def scenario():
        host = PEHost(SimpleNamespace(address="tcp://127.0.0.1:1", handlers={}))
        host.secrets["dep"] = b"secret"
        ended = asyncio.Event()
        host.pes[("dep", "old")] = _slow_pe(ended)
        stopping = asyncio.ensure_future(host.pe_stop("dep"))
        await asyncio.sleep(0)                      # the stop waits for the old PE to end
        store = store_dir("op", "dep")              # the restore's PE: deployed, its store opened
        host.pes[("dep", "new")] = SimpleNamespace(task=None)
        ended.set()
        assert await asyncio.wait_for(stopping, 5) == ["old"]
        assert os.path.isdir(store) and host.secrets["dep"] == b"secret"
        assert list(host.pes) == [("dep", "new")]

    with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
        asyncio.run(scenario())


def test_a_deployment_stopped_whole_is_over_here(tmp_path):
    async def scenario():
        host = PEHost(SimpleNamespace(address="tcp://127.0.0.1:1", handlers={}))
        host.secrets["dep"] = b"secret"
        ended = asyncio.Event()
        ended.set()
        host.pes[("dep", "old")] = _slow_pe(ended)
        store = store_dir("op", "dep")
        assert await asyncio.wait_for(host.pe_stop("dep"), 5) == ["old"]
        assert not os.path.exists(store) and not os.path.exists(deployment_dir("dep"))
        assert "dep" not in host.secrets and not host.pes

    with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
        asyncio.run(scenario())

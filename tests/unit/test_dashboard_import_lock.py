"""Dask's bokeh pages are imported in a thread of the deploying process once a run has lasted a
monitor interval (``Deployment._dashboard_after_an_interval``); that import holds the process's
GIL in bursts for 0.5-0.9 s of CPU, which the controller's calls in a reconfiguration's pause share.
It runs under the reconfiguration lock: a reconfiguration asked meanwhile waits for it, not its
pause (beside it, the first Release and Move after a deploy paused 38-135 ms instead of 8-26)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import dask.config

from pescheduler.control.deployment import Deployment


def test_the_dashboards_import_holds_the_reconfiguration_lock_until_it_is_done():
    release, seen = threading.Event(), {}

    async def scenario():
        lock, began = asyncio.Lock(), asyncio.Event()

        def attach():
            seen["locked when it began"] = lock.locked()
            began.set()
            thread = threading.Thread(target=release.wait, args=(30,), daemon=True)
            thread.start()
            return thread
        fake = SimpleNamespace(_done=asyncio.Event(), reconfigurer=SimpleNamespace(lock=lock),
                               cluster=SimpleNamespace(attach_dashboard=attach))
        importing = asyncio.ensure_future(Deployment._dashboard_after_an_interval(fake))
        await asyncio.wait_for(began.wait(), 30)            # the interval ends, the import begins
        asked = asyncio.ensure_future(lock.acquire())       # a reconfiguration asked meanwhile
        for _ in range(10):                                 # a free lock is taken within a step of the loop
            await asyncio.sleep(0)
        seen["a reconfiguration went first"] = asked.done()
        release.set()                                       # the import ends
        await asyncio.wait_for(asked, 30)
        lock.release()
        await asyncio.wait_for(importing, 30)

    with dask.config.set({"pescheduler.monitor.interval": "10ms"}):
        asyncio.run(scenario())
    assert seen == {"locked when it began": True, "a reconfiguration went first": False}, seen

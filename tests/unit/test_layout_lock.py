"""The reconfiguration lock (``LayoutLock``) says what holds it: an action that waited names it in
its steps, and the status's ``reconfiguring`` says what an action in flight waits for.

Dask's bokeh pages are imported in the deploying process once a run has lasted a monitor interval
(``Deployment._dashboard_after_an_interval``); that import holds the process's GIL in bursts for
0.5-0.9 s of CPU, which the controller's calls in a reconfiguration's pause share. Each of its
steps runs under the lock: a reconfiguration asked meanwhile waits for the step, not its pause
(beside the import, the first Release and Move after a deploy paused 38-135 ms instead of 8-26) and
not the whole import (held whole, beside a loaded suite, 12-14 s: session 81)."""

from __future__ import annotations

import asyncio
import shutil
import threading
from types import SimpleNamespace

import dask.config
from distributed.core import Status

from pescheduler.control import cluster
from pescheduler.control.cluster import EmbeddedCluster
from pescheduler.actions import Replicate
from pescheduler.control.deployment import Deployment
from pescheduler.control.protocol import ApplyRecord
from pescheduler.control.reconfigurer import LayoutLock, Reconfigurer
from pescheduler.liveview import format_line, reconfiguring_line, screen


def test_a_reconfiguration_asked_during_the_dashboards_import_waits_for_one_step_of_it(monkeypatch):
    steps, imported, connected = ("first", "second", "last"), [], []
    gates = {name: threading.Event() for name in steps}

    def import_step(name):
        gates[name].wait(30)                    # the step's CPU, as long as the test says
        imported.append(name)
        return SimpleNamespace(connect=lambda *args, **kw: connected.append(name))
    monkeypatch.setattr(cluster, "DASHBOARD_STEPS", steps)
    monkeypatch.setattr(cluster, "_import_bokeh", import_step)
    embedded = EmbeddedCluster(1)
    shutil.rmtree(embedded._log_dir, ignore_errors=True)
    embedded._scheduler = SimpleNamespace(status=Status.running, http_application=None, http_server=None)
    seen = {}

    async def scenario():
        lock = asyncio.Lock()
        attaching = asyncio.ensure_future(embedded.attach_dashboard(lambda: lock, 30))
        while not lock.locked():                # the first step began
            await asyncio.sleep(0)
        asked = asyncio.ensure_future(lock.acquire())      # a reconfiguration asked meanwhile
        for _ in range(10):                     # a free lock is taken within a step of the loop
            await asyncio.sleep(0)
        seen["went during a step"] = asked.done()
        gates["first"].set()                    # the first step ends
        await asyncio.wait_for(asked, 30)
        seen["imported before it"] = list(imported)
        for _ in range(10):                     # the import waits for it
            await asyncio.sleep(0)
        seen["imported while it held the lock"] = list(imported)
        lock.release()
        gates["second"].set()
        gates["last"].set()
        await asyncio.wait_for(attaching, 30)
        await embedded.attach_dashboard(lambda: lock, 30)   # once per cluster

    asyncio.run(scenario())
    assert seen == {"went during a step": False, "imported before it": ["first"],
                    "imported while it held the lock": ["first"]}, seen
    assert imported == ["first", "second", "last"] and connected == ["last"]


def test_the_deployment_imports_the_dashboard_under_its_reconfiguration_lock():
    seen = {}

    async def scenario():
        lock = LayoutLock()

        async def attach(step, wait_s):
            async with step():
                seen["locked"] = lock.locked()
                seen["holder"] = lock.holder
        fake = SimpleNamespace(_done=asyncio.Event(), reconfigurer=SimpleNamespace(lock=lock),
                               cluster=SimpleNamespace(attach_dashboard=attach))
        await asyncio.wait_for(Deployment._dashboard_after_an_interval(fake), 30)

    with dask.config.set({"pescheduler.monitor.interval": "10ms"}):
        asyncio.run(scenario())
    assert seen == {"locked": True, "holder": "a step of Dask's dashboard import"}


def test_an_action_that_waited_for_the_lock_names_what_held_it_in_its_steps():
    reconfigurer = Reconfigurer(None, SimpleNamespace(event=lambda kind, text: None), "d", None, 1)

    async def planned(action):
        return None, None, SimpleNamespace(retired=(), hold=False)

    async def run(action, old, new, plan, timeout, steps):
        return ApplyRecord(action, True, steps=steps)
    reconfigurer._planned, reconfigurer._run = planned, run

    async def scenario():
        holding, go = asyncio.Event(), asyncio.Event()

        async def checkpoint():
            async with reconfigurer.lock.held("checkpoint 7"):
                holding.set()
                await go.wait()
        held = asyncio.ensure_future(checkpoint())
        await asyncio.wait_for(holding.wait(), 30)
        applying = asyncio.ensure_future(reconfigurer.apply(Replicate("op"), 30))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not applying.done()
        flight = reconfigurer.in_flight()           # the status's "reconfiguring"
        assert flight == {"action": "Replicate('op', 1)", "age_s": flight["age_s"], "waits_for": "checkpoint 7"}
        go.set()
        waited = await asyncio.wait_for(applying, 30)
        await held
        alone = await asyncio.wait_for(reconfigurer.apply(Replicate("op"), 30), 30)
        return waited, alone

    waited, alone = asyncio.run(scenario())
    assert list(waited.steps) == ["lock: checkpoint 7", "plan"] and list(alone.steps) == ["lock", "plan"]
    assert reconfigurer.lock.holder is None and reconfigurer.in_flight() is None


def test_the_live_view_and_the_log_line_say_what_an_action_applied_for_a_second_waits_for():
    status = {"app": "a", "state": "running", "elapsed_s": 3.0, "pes": [],
              "reconfiguring": {"action": "Replicate('slow', 1)", "age_s": 2.4, "waits_for": "checkpoint 7"}}
    assert reconfiguring_line(status).plain == "reconfiguring Replicate('slow', 1) 2s (waits for checkpoint 7)"
    assert format_line(status).endswith("| reconfiguring Replicate('slow', 1) 2s (waits for checkpoint 7)")
    brief = {**status, "reconfiguring": {**status["reconfiguring"], "age_s": 0.3}}
    assert reconfiguring_line(brief) is None and "reconfiguring" not in format_line(brief)
    assert "reconfiguring Replicate('slow', 1) 2s" in screen({**status, "events": [], "slots": []}).renderables[1].plain

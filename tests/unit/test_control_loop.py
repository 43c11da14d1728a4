"""The control loop outlives a failing step: a monitor that stopped silently would blind the
policies, status and stall detection while the deployment still says ``running``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import dask.config

from pescheduler.control.control_loop import ControlLoop
from pescheduler.control.reconfigurer import LayoutLock
from pescheduler.control.state import DeploymentState


class Gateway:
    def __init__(self) -> None:
        self.published = 0

    async def stats_each(self, workers, dead_letters=True, acked=None):
        return [], {}

    async def publish(self, status) -> None:
        self.published += 1

    async def take_command(self):
        return self.command

    command = None
    ring = None

    def on_command(self, ring) -> None:
        self.ring = ring


class Monitor:
    """Its first fold raises (a bug in one round); every later one works."""

    def __init__(self) -> None:
        self.calls = 0
        self.latest = None

    def update(self, answers, placement):
        self.calls += 1
        if self.calls == 1:
            raise KeyError("burn#1")
        self.latest = SimpleNamespace(pes={})
        return self.latest


def test_a_collect_that_raises_is_logged_on_the_record_and_the_next_interval_collects_again(caplog):
    gateway, monitor = Gateway(), Monitor()
    state = DeploymentState()
    reconfigurer = SimpleNamespace(running_on=lambda: [], placement=None, activated=lambda answers: None, loaded=lambda answers: None,
                                   lock=LayoutLock())
    loop = ControlLoop(gateway, reconfigurer, state, monitor, SimpleNamespace(keep=lambda d: None), dict)

    async def main() -> None:
        done = asyncio.Event()
        task = asyncio.create_task(loop.run(done))
        for _ in range(3):                               # three snapshots after the failed one
            await asyncio.wait_for(loop.sampled.wait(), 10)
        done.set()
        await asyncio.wait_for(task, 10)

    with dask.config.set({"pescheduler.monitor.interval": "10ms"}):
        asyncio.run(main())
    assert monitor.calls >= 4 and gateway.published >= 3
    assert any(e["kind"] == "error" and "collect failed" in e["text"] and "burn#1" in e["text"]
               for e in state.events), state.events
    assert "control loop: collect failed" in caplog.text


def test_a_stop_rung_on_the_command_topic_is_taken_at_once_not_at_the_next_poll(monkeypatch):
    """``stop`` rings the deployment's command topic: the loop takes the command then, not after
    COMMAND_POLL_S (set to a minute here, as is the monitor interval)."""
    from pescheduler.control import control_loop

    monkeypatch.setattr(control_loop, "COMMAND_POLL_S", 60.0)
    gateway = Gateway()
    reconfigurer = SimpleNamespace(running_on=lambda: [], placement=None, lock=LayoutLock())
    loop = ControlLoop(gateway, reconfigurer, DeploymentState(), Monitor(), SimpleNamespace(keep=lambda d: None), dict)
    stopped = asyncio.Event()

    async def on_stop() -> None:
        stopped.set()
    loop.on_stop = on_stop

    async def main() -> None:
        done = asyncio.Event()
        task = asyncio.create_task(loop.run(done))
        await asyncio.sleep(0)                           # the loop subscribes, then waits
        assert gateway.ring is not None, "the loop did not subscribe to its command topic"
        gateway.command = "stop"
        gateway.ring()
        await asyncio.wait_for(stopped.wait(), 10)       # far below the 60 s poll
        done.set()
        await asyncio.wait_for(task, 10)

    with dask.config.set({"pescheduler.monitor.interval": "60s"}):
        asyncio.run(main())

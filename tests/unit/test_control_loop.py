"""The control loop outlives a failing step: a monitor that stopped silently would blind the
policies, status and stall detection while the deployment still says ``running``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import dask.config

from pescheduler.control.control_loop import ControlLoop
from pescheduler.control.state import DeploymentState


class Gateway:
    def __init__(self) -> None:
        self.published = 0

    async def stats(self, workers):
        return []

    async def publish(self, status) -> None:
        self.published += 1

    async def take_command(self):
        return None


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
    reconfigurer = SimpleNamespace(running_on=lambda: [], placement=None, activated=lambda answers: None,
                                   lock=asyncio.Lock())
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

"""The monitor's collect gives up a worker that does not answer after ``calls.worker``.

A worker SIGKILLed while a collect is in flight to it does not refuse the call: Dask retries
the connection until its 30 s connect timeout, and the control loop (snapshots, the published
status, commands, policy rounds) waited with it after every loss. The real path, a SIGKILLed
worker under checkpoints, is tests/integration/test_kafka_exactly_once.py and
test_dashboard.py's restart count; here a worker that never answers stands for it.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import dask.config

from pescheduler.control.control_loop import ControlLoop
from pescheduler.control.gateway import WorkerGateway
from pescheduler.control.state import DeploymentState

BOUND_S = 0.3


class Client:
    """``rpc(worker).pe_stats(...)``: the ``dead`` worker never answers, the others at once."""

    def __init__(self, dead: str) -> None:
        self.dead = dead

    def rpc(self, worker: str):
        async def pe_stats(**_kwargs):
            if worker == self.dead:
                await asyncio.Event().wait()
            return {"pes": {}, "dead_letters": []}
        return SimpleNamespace(pe_stats=pe_stats)


def test_a_collect_waiting_on_a_dead_worker_is_given_up_after_the_call_bound():
    with dask.config.set({"pescheduler.calls.worker": f"{BOUND_S}s"}):
        gateway = WorkerGateway(Client(dead="tcp://dead:1"), "d", ())
    published = []

    async def publish(status) -> None:
        published.append(status)
    gateway.publish = publish
    running = ["tcp://live:1", "tcp://dead:1"]
    reconfigurer = SimpleNamespace(running_on=lambda: list(running), placement=None,
                                   activated=lambda answers: None, loaded=lambda answers: None)
    monitor = SimpleNamespace(update=lambda answers, placement: SimpleNamespace(pes={}))
    loop = ControlLoop(gateway, reconfigurer, DeploymentState(), monitor, SimpleNamespace(keep=lambda d: None),
                       dict)

    async def main() -> float:
        t0 = time.monotonic()
        await asyncio.wait_for(loop.collect(), 10 * BOUND_S)     # unbounded, this waited forever
        took = time.monotonic() - t0
        assert published == []                                 # that collect had no answer to publish
        running.remove("tcp://dead:1")                         # the restore placed the PEs elsewhere
        await asyncio.wait_for(loop.collect(), 10 * BOUND_S)
        assert len(published) == 1
        return took

    took = asyncio.run(main())
    assert BOUND_S <= took < 5 * BOUND_S, took

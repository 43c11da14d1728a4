"""The monitor's collect gives up a worker that does not answer after ``calls.worker``.

A worker SIGKILLed while a collect is in flight to it does not refuse the call: Dask retries
the connection until its 30 s connect timeout, and the control loop (snapshots, the published
status, commands, policy rounds) waited with it after every loss. The real path, a SIGKILLed
worker under checkpoints, is tests/integration/test_kafka_exactly_once.py and
test_dashboard.py's restart count; here a worker that never answers stands for it.
"""

from __future__ import annotations

import asyncio
import pickle
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
            return {"worker": worker, "incarnation": "i", "pes": {}, "dead_letters": []}
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


class Letters(Client):
    """The live worker answers with a dead letter each time it is asked (taken off its PEs as it
    answers, as ``pe_stats`` does); the dead one never answers."""

    def rpc(self, worker: str):
        async def pe_stats(**_kwargs):
            if worker == self.dead:
                await asyncio.Event().wait()
            return {"worker": worker, "incarnation": "i", "pes": {},
                    "dead_letters": [{"op": "jsonl-1", "pe": "p", "item": {"n": 1}, "error": "bad", "seq": 1}]}
        return SimpleNamespace(pe_stats=pe_stats)


def test_the_dead_letters_a_worker_handed_over_are_kept_when_another_worker_does_not_answer():
    """A collect whose other worker missed the call bound dropped every answer, and with them the
    dead letters the answering workers had handed over (they are taken off the PEs as they
    answer): a loaded run's final status counted 0 of its 5 dead letters. Now they are kept, and
    the collect says it is not complete (no snapshot of a part of the workers)."""
    with dask.config.set({"pescheduler.calls.worker": f"{BOUND_S}s"}):
        gateway = WorkerGateway(Letters(dead="tcp://dead:1"), "d", ())
    kept = []
    reconfigurer = SimpleNamespace(running_on=lambda: ["tcp://live:1", "tcp://dead:1"], placement=None)
    updates = []
    monitor = SimpleNamespace(update=lambda answers, placement: updates.append(answers))
    loop = ControlLoop(gateway, reconfigurer, DeploymentState(), monitor,
                       SimpleNamespace(keep=lambda d: kept.append(d)), dict)
    complete = asyncio.run(asyncio.wait_for(loop.collect(), 10 * BOUND_S))
    assert [d["item"] for d in kept] == [{"n": 1}]
    assert complete is False and updates == []


def test_the_last_collect_is_tried_again_and_said_when_it_never_completes():
    """Every PE finished: the last collect must bring in what is still on the workers. One that
    missed is tried again; one that misses every try is said in the events, not silent."""
    from pescheduler.control import deployment

    class Loop:
        def __init__(self, outcomes):
            self.outcomes = list(outcomes)

        async def collect(self):
            return self.outcomes.pop(0)

    def finishing(outcomes):
        state = DeploymentState()
        state.running({})
        dep = SimpleNamespace(loop=Loop(outcomes), _done=asyncio.Event(), state=state,
                              dead=SimpleNamespace(verdict=lambda snapshot: None), monitor=SimpleNamespace(latest=None))
        asyncio.run(deployment.Deployment._finish(dep))
        return dep

    second = finishing([False, True])
    assert second.loop.outcomes == [] and second.state.state == "finished" and second._done.is_set()
    assert not [e for e in second.state.events if e["kind"] == "monitor"]
    never = finishing([False] * deployment.FINAL_COLLECTS)
    assert never.state.state == "finished"
    assert [e["text"] for e in never.state.events if e["kind"] == "monitor"] == [
        f"the last counters were not collected from every worker in {deployment.FINAL_COLLECTS} tries: "
        "the final figures and dead letters may be short"]


class LostAnswers:
    """``rpc(worker).pe_stats(...)`` is the PE host's own handler (``PEHost.pe_stats`` over a PE
    whose dead letters the test adds); the answers of the first ``lose`` calls never arrive: the
    handler ran here, took the letters off the PE, and its caller gave up (``calls.worker``)."""

    def __init__(self, lose: int) -> None:
        from pescheduler.worker.dead_outbox import DeadLetterOutbox

        self.lose, self.letters = lose, []
        pe = SimpleNamespace(pe_id="p", take_dead_letters=self._take, stats=lambda: {})
        self.host = SimpleNamespace(_of=lambda deployment: {"p": pe}, outbox=DeadLetterOutbox(), version=0,
                                    worker=SimpleNamespace(address="tcp://w:1"), _process_stats=lambda: {})

    def _take(self):
        taken, self.letters = self.letters, []
        return taken

    def rpc(self, worker: str):
        from pescheduler.worker.pehost import PEHost

        async def pe_stats(**kwargs):
            answer = pickle.loads(pickle.dumps(PEHost.pe_stats(self.host, **kwargs)))     # as over the wire
            if self.lose:
                self.lose -= 1
                await asyncio.Event().wait()
            return answer
        return SimpleNamespace(pe_stats=pe_stats)


def test_a_dead_letter_whose_answer_was_lost_is_handed_over_again_and_kept_once():
    """The worker ran the collect's call and took its PEs' dead letters, but the answer came after
    the caller gave up: the letters were gone with it. Now the worker keeps each one until a later
    call acknowledges it; the controller keeps each once (two collects at once both get the
    letters not yet acknowledged), and a new PE host on the same address (its numbers start
    again) is not taken for the old one."""
    from pescheduler.worker.dead_outbox import DeadLetterOutbox

    def letter(n):
        return SimpleNamespace(operator="jsonl-1", item={"n": n}, error="bad")

    with dask.config.set({"pescheduler.calls.worker": f"{BOUND_S}s"}):
        client = LostAnswers(lose=1)
        gateway = WorkerGateway(client, "d", ())
    gateway.publish = lambda status: asyncio.sleep(0)
    from pescheduler.control.deadletters import DeadLetters

    dead = DeadLetters()
    reconfigurer = SimpleNamespace(running_on=lambda: ["tcp://w:1"], placement=None,
                                   activated=lambda answers: None, loaded=lambda answers: None)
    monitor = SimpleNamespace(update=lambda answers, placement: SimpleNamespace(pes={}))
    loop = ControlLoop(gateway, reconfigurer, DeploymentState(), monitor, dead, dict)
    kept = []

    async def collect():
        complete = await asyncio.wait_for(loop.collect(), 10 * BOUND_S)
        kept[:] = [d["item"]["n"] for d in dead.kept]
        return complete

    async def main():
        client.letters = [letter(1), letter(2)]
        assert await collect() is False and kept == []          # taken there, the answer lost
        assert await collect() is True and kept == [1, 2]       # answered again
        client.letters = [letter(3)]
        assert await collect() is True and kept == [1, 2, 3]    # 1 and 2 acknowledged: not again
        assert await collect() is True and kept == [1, 2, 3]
        client.letters = [letter(4), letter(5)]                  # two collects at once (the last one's
        assert await asyncio.gather(collect(), collect()) == [True, True]   # and the timer's): each answers 4, 5
        assert kept == [1, 2, 3, 4, 5]
        client.host.outbox = DeadLetterOutbox()                  # a new PE host at the same address
        client.letters = [letter(6)]
        assert await collect() is True and kept == [1, 2, 3, 4, 5, 6]

    asyncio.run(main())

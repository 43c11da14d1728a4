"""The PE's idle wait (worker/flow.py ``InputScheduler.idle``), driven directly: it does not wait
while there is work, it ends when the first thing is due or input comes, and says which wait
it was (idle, or backpressure on a full channel's gate)."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from types import SimpleNamespace

from pescheduler.worker.channels import DATA, ChannelIn, Inbox, LocalChannelOut
from pescheduler.worker.flow import InputScheduler


def _scheduler():
    """A PE's scheduler with no outputs, its inbox, and the waits it counted (the gate, or None)."""
    inbox, waits = Inbox(), []

    @contextmanager
    def waiting(gate):
        waits.append(gate)
        yield

    scheduler = InputScheduler(inbox, [], 8, 0.05, lambda: 0.0, lambda *item: False, lambda *item: None)
    return scheduler, inbox, waits, waiting


def test_input_that_may_be_taken_means_no_wait_at_all():
    async def scenario():
        scheduler, inbox, waits, waiting = _scheduler()
        inbox.put(ChannelIn("c", "up", "out"), DATA, [{"n": 1}])
        await asyncio.wait_for(scheduler.idle(lambda: [60.0], waiting), 5)
        assert waits == [] and not inbox.event.is_set(), "the wake-up is cleared before looking"
    asyncio.run(scenario())


def test_nothing_to_do_waits_until_the_first_due_time_and_counts_as_idle():
    async def scenario():
        scheduler, _inbox, waits, waiting = _scheduler()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.wait_for(scheduler.idle(lambda: [60.0, 0.02], waiting), 5)
        assert loop.time() - t0 >= 0.02 and waits == [None]
    asyncio.run(scenario())


def test_input_arriving_ends_the_wait_before_anything_is_due():
    async def scenario():
        scheduler, inbox, waits, waiting = _scheduler()
        idle = asyncio.create_task(scheduler.idle(lambda: [], waiting))
        await asyncio.sleep(0)
        assert not idle.done() and waits == [None], "nothing due: it waits for input alone"
        inbox.put(ChannelIn("c", "up", "out"), DATA, [{"n": 1}])
        await asyncio.wait_for(idle, 5)
    asyncio.run(scenario())


def test_a_wait_while_input_is_held_back_for_a_full_channel_is_that_channel_s_backpressure():
    async def scenario():
        scheduler, _inbox, waits, waiting = _scheduler()
        full = LocalChannelOut("c-out", 8)
        full.send([{"n": 1}])
        full.gate.credits = 0
        scheduler.outs.append((SimpleNamespace(src_op="tag"), full))
        scheduler.full = frozenset({"tag"})
        await asyncio.wait_for(scheduler.idle(lambda: [0.01], waiting), 5)
        assert waits == [full.gate]
    asyncio.run(scenario())

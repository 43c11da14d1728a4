"""A reconfiguration that reaches a PE as it ends still gets what it re-sends shipped.

The loaded suite of session 77: the latency guard's ``Release('slow', 1)``, asked as the source
ended, waited 30 s for ``slow#1``'s input, which its source PE (``finished``, its chain frozen)
held unsent: ``[END, hold]``. The Replicate before it had rewired the source PE after its loop
had left (its channels' END went out, its last flush waited for credit): the rewire re-sends the
END on the new channels (``Rewirer._replay``), and only the loop shipped those, so the END to the
copy never went; the Release then held that channel behind it. Here both times it can come, on a
real PE runner with in-memory channels: while the PE's last flush waits for credit, and after the
PE finished.

Those two did not mend it (session 78's loaded suite failed the same way). The channel behind it
was one a Replicate of the stateless ``slow`` added beside the kept ones after the source had
ended (``1/...->slow#1``, the source's others from epoch 0): no channel was removed, so the rewire
re-sent no END, and the copy never got one (session 79: ``Chain.end_sent``).
"""

from __future__ import annotations

import asyncio

from pescheduler.worker.channels import DATA, END, ChannelIn, Inbox
from pescheduler.wire import OutputSpec, RouterTargets

from test_held_watermarks import BOTH, HERE, _kinds, _upstream, rewire_outputs

TO_W_AGAIN = OutputSpec("c-w2", "tag", "out", "pe-w", "tcp://w", HERE, ("w",))
BOUND = 2000          # loop turns a step may take (each a yield; no wall clock)


async def _turns_until(condition, what: str) -> None:
    for _ in range(BOUND):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not within {BOUND} loop turns: {what}")


async def _ended_with_copy_waiting():
    """PE ``up`` running: a tuple to ``w`` shipped with its END, one to ``w#1`` waiting for credit
    (``c-copy`` has none) when the source ends; returns with its last flush waiting for it."""
    pe, inboxes = await _upstream()
    inboxes["c-w2"] = Inbox()
    copy = dict((ch.channel_id, ch) for _s, ch in pe.ports.outs)["c-copy"]
    copy.gate.credits = 0
    pe.start()
    src = pe.ports.receivers["c-src"]
    pe.ports.inbox.put(src, DATA, [{"n": 1, "ts": 100}])        # smooth round robin: w
    pe.ports.inbox.put(src, DATA, [{"n": 2, "ts": 200}])        # w#1
    pe.ports.inbox.put(src, END, None)
    await _turns_until(lambda: pe.chain.finished and copy.gate._since is not None, "the last flush waits for credit")
    assert pe.state == "running"
    return pe, inboxes, copy


async def _finished():
    """:func:`_ended_with_copy_waiting`, then the copy's credit granted and the PE finished."""
    pe, inboxes, copy = await _ended_with_copy_waiting()
    copy.gate.release()
    await asyncio.wait_for(pe.task, 10)
    assert pe.state == "finished"
    return pe, inboxes


def _receivers(inboxes):
    return lambda cid: (inboxes[cid], ChannelIn(cid, "tag", "out"))


def test_a_rewire_while_the_last_flush_waits_for_credit_ships_its_end():
    """On the code before, the last flush went over the channels as they were when it began: the
    rewire's new channel (its END, re-sent) came after the one it waited on, and was never shipped."""
    async def scenario():
        pe, inboxes, copy = await _ended_with_copy_waiting()
        assert _kinds(inboxes["c-w"]) == [(DATA, [1]), (END, None)]
        await pe.hold(["c-w"], "m1")                     # a Replicate of w begins: c-w ended, holds
        await rewire_outputs(pe, [TO_W_AGAIN], ["c-w"], _receivers(inboxes), BOTH, {"w#1": "w"})
        copy.gate.release()                              # the copy grants: the last flush goes on
        await asyncio.wait_for(pe.task, 10)
        assert pe.state == "finished"
        assert _kinds(inboxes["c-copy"]) == [(DATA, [2]), (END, None)]
        assert _kinds(inboxes["c-w2"]) == [(END, None)], "the rewired channel's END was not shipped"
    asyncio.run(scenario())


def test_a_rewire_after_the_pe_finished_ships_its_end():
    """On the code before, nothing shipped what a rewire of a finished PE queued."""
    async def scenario():
        pe, inboxes = await _finished()
        await pe.hold(["c-w"], "m1")
        await rewire_outputs(pe, [TO_W_AGAIN], ["c-w"], _receivers(inboxes), BOTH, {"w#1": "w"})
        await _turns_until(lambda: inboxes["c-w2"].items, "the rewired channel's END")
        assert _kinds(inboxes["c-w2"]) == [(END, None)]
        assert pe.state == "finished"
    asyncio.run(scenario())


def test_a_hold_of_a_finished_pe_ships_nothing_more():
    """Its channels ended: END aligns the receiver (ChannelOut.hold), no marker follows it."""
    async def scenario():
        pe, inboxes = await _finished()
        await pe.hold(["c-w", "c-copy"], "m1")
        for _ in range(50):
            await asyncio.sleep(0)
        assert _kinds(inboxes["c-w"]) == [(DATA, [1]), (END, None)]
        assert _kinds(inboxes["c-copy"]) == [(DATA, [2]), (END, None)]
    asyncio.run(scenario())


TO_W_COPY2 = OutputSpec("c-w3", "tag", "out", "pe-w3", "tcp://w", HERE, ("w#2",))
THREE = {("tag", "out", "w"): (RouterTargets(("w", "w#1", "w#2"), (1, 1, 1)), None)}


def test_a_route_added_after_the_end_beside_the_kept_ones_carries_the_end():
    """A Replicate of a stateless consumer keeps the upstream's channels and adds one to the copy
    (nothing held, nothing removed, so ``Rewirer._replay`` sends it nothing). The upstream had
    ended: on the code before, that channel never got an END, so the copy never ended, and a
    Release of it then held the channel behind its marker with no loop to ship it (the loaded
    suites of sessions 77 and 78: ``1/iterable-1.out->slow#1[cr=8 pend=2]``, the source PE finished)."""
    async def scenario():
        pe, inboxes = await _finished()
        inboxes["c-w3"] = Inbox()
        await rewire_outputs(pe, [TO_W_COPY2], [], _receivers(inboxes), THREE, {"w#1": "w", "w#2": "w"})
        await _turns_until(lambda: inboxes["c-w3"].items, "the added channel's END")
        assert _kinds(inboxes["c-w3"]) == [(END, None)]
        assert _kinds(inboxes["c-w"]) == [(DATA, [1]), (END, None)], "the kept channels get nothing more"
        assert _kinds(inboxes["c-copy"]) == [(DATA, [2]), (END, None)]
    asyncio.run(scenario())


def test_a_route_added_while_the_source_still_runs_gets_its_end_once_with_the_others():
    """The same rewire before the end: the added channel's END comes with the others', once."""
    async def scenario():
        pe, inboxes = await _upstream()
        inboxes["c-w3"] = Inbox()
        pe.start()
        src = pe.ports.receivers["c-src"]
        await rewire_outputs(pe, [TO_W_COPY2], [], _receivers(inboxes), THREE, {"w#1": "w", "w#2": "w"})
        for n in range(3):
            pe.ports.inbox.put(src, DATA, [{"n": n, "ts": 100 * n}])
        pe.ports.inbox.put(src, END, None)
        await asyncio.wait_for(pe.task, 10)
        for channel in ("c-w", "c-copy", "c-w3"):
            assert [k for k, _p in _kinds(inboxes[channel])].count(END) == 1, (channel, _kinds(inboxes[channel]))
    asyncio.run(scenario())

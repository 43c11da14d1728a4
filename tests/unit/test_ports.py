"""A PE's channel ends (worker/ports.py), driven directly: what the PE host looks up, what a
checkpoint puts back, how output channels open to a receiver on the same worker."""

from __future__ import annotations

import asyncio

import pytest

from pescheduler.wire import InputSpec, OutputSpec, PESpec
from pescheduler.worker.channels import DATA, WATERMARK, ChannelIn, Inbox, LocalChannelOut
from pescheduler.worker.ports import Ports

HERE = "127.0.0.1:1"


def _spec(outputs=()) -> PESpec:
    return PESpec("pe", "d", {}, [], inputs=[InputSpec("c-a", "a", "out"), InputSpec("c-b", "b", "out")],
                  outputs=list(outputs))


def _out(channel_id: str, src_op: str) -> OutputSpec:
    return OutputSpec(channel_id, src_op, "out", "pe-down", "tcp://w", HERE, ("down",))


def test_the_receiving_end_of_each_input_is_found_by_its_channel_id_and_no_other():
    ports = Ports(_spec(), None, lambda *dead: None)
    inbox, receiver = ports.receiver("c-b")
    assert inbox is ports.inbox and (receiver.channel_id, receiver.src_op) == ("c-b", "b")
    with pytest.raises(KeyError):
        ports.receiver("c-elsewhere")


def test_parked_items_go_back_in_front_of_the_inbox_in_their_order():
    ports = Ports(_spec(), None, lambda *dead: None)
    a, b = ports.receivers["c-a"], ports.receivers["c-b"]
    ports.inbox.put(b, DATA, [{"n": 3}])
    ports.put_back([(a, DATA, [{"n": 1}]), (a, WATERMARK, 2)])
    assert [(c.channel_id, kind) for c, kind, _p in ports.inbox.items] == [("c-a", DATA), ("c-a", WATERMARK),
                                                                          ("c-b", DATA)]


def test_outputs_open_in_memory_to_a_receiver_here_grouped_by_producer_and_wake_the_pe_on_credit():
    async def scenario():
        down_inbox, down = Inbox(), ChannelIn("c-1", "up", "out")
        ports = Ports(_spec([_out("c-1", "up"), _out("c-2", "other")]), None, lambda *dead: None)
        outputs = ports.open(({"c-1": (down_inbox, down)}.__getitem__, HERE, _expect_later))
        assert sorted(outputs) == [("other", "out"), ("up", "out")]
        first = ports.outputs_of("up")
        assert [ch.channel_id for ch in first] == ["c-1"] and isinstance(first[0], LocalChannelOut)
        first[0].send([{"n": 1}])
        await first[0].flush()
        assert [(c.channel_id, kind) for c, kind, _p in down_inbox.items] == [("c-1", DATA)]
        first[0].gate.wake()                       # credit came back: the PE's idle wait ends
        assert ports.inbox.event.is_set()
        assert ports.stats([{"c-a": 1.0}])["channels_in"]["c-a"]["marked"]
        assert not ports.stats([{"c-a": 1.0}])["channels_in"]["c-b"]["marked"]
        await asyncio.sleep(0)                     # c-2's opening starts waiting for its receiver
        await ports.close()
    asyncio.run(scenario())


async def _expect_later(channel_id: str):
    """A receiver that never comes (the channel to it waits)."""
    await asyncio.Event().wait()


def test_a_receiver_not_here_yet_is_waited_for_only_when_the_caller_says_how():
    ports = Ports(_spec([_out("c-1", "up")]), None, lambda *dead: None)
    with pytest.raises(KeyError):
        ports.open_channel(_out("c-1", "up"), ({}.__getitem__, HERE, None))

    async def later():
        channel = ports.open_channel(_out("c-1", "up"), ({}.__getitem__, HERE, _expect_later))
        assert channel.channel_id == "c-1" and ports.outs == []     # a rewire adds it, not the port
        await asyncio.sleep(0)
        assert channel.opening is not None and not channel.opening.done()    # waiting for the receiver
        await channel.close(timeout=0)
    asyncio.run(later())

"""A channel's linger (channels.py, ``pescheduler.batch.linger``): small batches wait for more up to
``linger`` and go as one; markers, barriers and end of stream ship at once with the data ahead.

The channel's clock is stubbed (``channels.perf_counter``): ripeness follows it alone, so no test
sleeps, and each assertion would fail were the data shipped early or held late."""

from __future__ import annotations

import asyncio

import pytest

import pescheduler.worker.channels as channels
from pescheduler.operators.sources import IterableSource
from pescheduler.worker.channels import DATA, END, MARKER, WATERMARK, ChannelIn, Inbox, LocalChannelOut
from pescheduler.worker.runtime import Hosting, PERunner
from pescheduler.wire import OutputSpec, PESpec

HERE = "127.0.0.1:1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(channels, "perf_counter", c)
    return c


def channel(linger_s=0.005, batch_size=10, credits=8):
    inbox = Inbox()
    out = LocalChannelOut("c1", credits, inbox, ChannelIn("c1", "src", "out"), linger_s=linger_s,
                          batch_size=batch_size)
    return out, inbox


def shipped(inbox):
    return [(kind, payload) for _ch, kind, payload in inbox.items]


def test_small_batches_wait_for_linger_then_go_as_one_with_the_newest_watermark(clock):
    async def main():
        out, inbox = channel()
        out.send([0])                  # a quiet channel, the receiver idle: it goes at once
        assert await out.flush(wait=False) and shipped(inbox) == [(DATA, [0])]
        inbox.items.clear()            # (the receiver has not taken it: its credit is out)
        first, second = [1, 2], [3]
        out.send(first)
        out.watermark(1)
        clock.now += 0.002
        out.send(second)
        out.watermark(2)
        assert await out.flush(wait=False) and shipped(inbox) == []     # not ripe: nothing goes
        assert not out.can_ship() and out.data_pending() == 1
        assert out.linger_left() == pytest.approx(0.003)
        clock.now += 0.0031
        assert out.can_ship() and out.linger_left() is None
        assert await out.flush(wait=False)
        assert shipped(inbox) == [(DATA, [1, 2, 3]), (WATERMARK, 2)]
        assert first == [1, 2] and second == [3]       # fan-out channels share these objects
        assert out.batches == 2 and out.tuples == 4 and out.gate.credits == 6
        assert not out.pending and out.linger_left() is None

    asyncio.run(main())


def test_a_full_batch_goes_at_once_and_coalescing_stops_at_batch_size(clock):
    async def main():
        out, inbox = channel(batch_size=4)
        for batch in ([1, 2], [3], [4, 5], [6]):
            out.send(batch)
        assert out.data_pending() == 2 and out.can_ship()
        assert await out.flush(wait=False)
        assert shipped(inbox) == [(DATA, [1, 2, 3])]     # the rest is less than a batch: it lingers
        clock.now += 0.006
        assert await out.flush(wait=False)
        assert shipped(inbox) == [(DATA, [1, 2, 3]), (DATA, [4, 5, 6])]

    asyncio.run(main())


@pytest.mark.parametrize("control", ["marker", "end", "hold"])
def test_markers_and_end_ship_lingering_data_at_once(clock, control):
    async def main():
        out, inbox = channel()
        out.send([1])
        out.watermark(7)
        out.send([2])
        if control == "marker":
            out.marker({"barrier": 1})
            expected = [(DATA, [1, 2]), (WATERMARK, 7), (MARKER, {"barrier": 1})]
        elif control == "end":
            out.end()
            expected = [(DATA, [1, 2]), (WATERMARK, 7), (END, None)]
        else:
            out.hold({"reconf": 1})
            expected = [(DATA, [1, 2]), (WATERMARK, 7), (MARKER, {"reconf": 1})]
        assert out.can_ship() and out.linger_left() is None
        assert await out.flush(wait=False)
        assert shipped(inbox) == expected
        if control == "hold":
            out.send([3])                       # after the hold: stays for the rewire
            assert out.held and out.take_held() == [(DATA, [3])]

    asyncio.run(main())


def test_a_watermark_ahead_of_a_batch_that_does_not_fit_keeps_its_place(clock):
    async def main():
        out, inbox = channel(batch_size=3)
        out.send([1, 2])
        out.watermark(5)
        out.send([3, 4])
        await out.flush(wait=False)                     # 4 tuples: ripe, but [3, 4] does not fit
        assert shipped(inbox) == [(DATA, [1, 2]), (WATERMARK, 5)]
        clock.now += 0.006
        await out.flush(wait=False)
        assert shipped(inbox) == [(DATA, [1, 2]), (WATERMARK, 5), (DATA, [3, 4])]

    asyncio.run(main())


def test_out_of_credit_ripe_data_waits_for_credit_not_for_a_timer(clock):
    async def main():
        out, inbox = channel(credits=1)
        out.send([1])
        clock.now += 0.01
        assert await out.flush(wait=False)
        out.send([2])
        clock.now += 0.01
        assert not await out.flush(wait=False)           # ripe, no credit: backpressure
        assert out.linger_left() is None and not out.can_ship()
        out.gate.release()
        assert await out.flush(wait=False)
        assert shipped(inbox) == [(DATA, [1]), (DATA, [2])]

    asyncio.run(main())


def test_flush_that_waits_ships_lingering_data_and_linger_zero_ships_each_batch(clock):
    async def main():
        out, inbox = channel()
        out.send([1])
        await out.flush()                                # the PE's last flush: nothing stays
        assert shipped(inbox) == [(DATA, [1])]
        plain, plain_inbox = channel(linger_s=0)
        plain.send([1])
        plain.send([2])
        assert plain.data_pending() == 2 and plain.linger_left() is None
        await plain.flush(wait=False)
        assert shipped(plain_inbox) == [(DATA, [1]), (DATA, [2])]     # today's behaviour

    asyncio.run(main())


def test_an_idle_receiver_gets_data_at_once_but_a_busy_channel_ships_once_per_linger(clock):
    """The receiver idle (all credit back): what comes after a quiet ``linger`` goes at once; what
    comes within ``linger`` of the last batch waits for that ``linger`` to pass, idle or not, so a
    steady trickle still ships a batch per ``linger``, not a batch per tuple."""
    async def main():
        out, inbox = channel()
        out.send([1])
        assert out.can_ship() and await out.flush(wait=False)
        assert shipped(inbox) == [(DATA, [1])]
        inbox.items.clear()
        out.gate.release()                      # the receiver took it: idle again
        clock.now += 0.001
        out.send([2])
        assert not out.can_ship() and out.linger_left() == pytest.approx(0.004)    # 5 ms after the last
        clock.now += 0.004
        assert out.can_ship() and await out.flush(wait=False)
        assert shipped(inbox) == [(DATA, [2])]
        inbox.items.clear()
        clock.now += 0.002
        out.send([3])                           # the receiver holds [2]: not idle, 5 ms after [3]
        assert not out.can_ship() and out.linger_left() == pytest.approx(0.005)
        out.gate.release()                      # it takes [2]: idle, 5 ms after [2] went
        assert out.linger_left() == pytest.approx(0.003)
        clock.now += 0.010
        out.send([4])                           # quiet for longer than linger: at once
        assert out.can_ship() and out.linger_left() is None

    asyncio.run(main())


class OneAtATime(IterableSource):
    """Returns one item per read, whatever is asked: a paced source's reads at a low rate."""

    def read(self, n):
        return super().read(1)


def test_a_pe_ships_full_batches_from_small_reads_and_its_end_at_once():
    """On a real PE runner: a source returning one tuple a read, ``batch.size`` 10 and a linger of
    a minute. The first tuple goes at once (the channel was quiet), then batches of 10 (not one a
    tuple), in order, and the last 4 go with END at once: the PE ends within the test's bound, not
    after the linger."""
    async def scenario():
        spec = PESpec("src", "dep", {"src": (OneAtATime, {"items": [{"n": i, "ts": i} for i in range(25)]}, None)}, [],
                      outputs=[OutputSpec("c-w", "src", "out", "pe-w", "tcp://w", HERE, ("w",))],
                      batch_size=10, linger_s=60.0)
        pe = PERunner(spec, Hosting("tcp://src"))
        inbox = Inbox()
        receiver = ChannelIn("c-w", "src", "out")
        await pe.connect(lambda cid: (inbox, receiver), HERE)
        receiver.grant = pe.ports.outs[0][1].gate.release          # the receiver takes every batch
        await asyncio.wait_for(pe.start(), 30)
        items = shipped(inbox)
        assert pe.state == "finished", pe.error
        assert [len(p) for k, p in items if k == DATA] == [1, 10, 10, 4] and items[-1] == (END, None)
        assert [t["n"] for k, p in items if k == DATA for t in p] == list(range(25))
        wms = [p for k, p in items if k == WATERMARK]
        assert wms == sorted(set(wms)) and len(wms) <= 4       # only the newest behind each batch
        assert pe.state == "finished"
    asyncio.run(scenario())

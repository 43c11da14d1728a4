"""A channel's latency target (channels.py, ``pescheduler.batch.latency``): small batches wait for more
up to the target and go as one, sized by the measured rate; markers, barriers, end of stream and a
window's fire ship at once with the data ahead, a watermark at once after a quiet target.

The channel's clock is stubbed (``channels.perf_counter``): ripeness follows it alone, so no test
sleeps, and each assertion would fail were the data shipped early or held late."""

from __future__ import annotations

import asyncio

import pytest

import pescheduler.worker.channels as channels
from pescheduler.operator import Operator, OperatorContext
from pescheduler.operators.sources import IterableSource
from pescheduler.worker.channels import DATA, END, MARKER, WATERMARK, ChannelIn, Inbox, LocalChannelOut
from pescheduler.worker.chain import Chain
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


def channel(latency_s=0.005, batch_size=10, credits=8, target=None):
    """A channel whose batches aim at ``target`` tuples (default: a full batch, a busy channel's)."""
    inbox = Inbox()
    out = LocalChannelOut("c1", credits, inbox, ChannelIn("c1", "src", "out"), latency_s=latency_s,
                          batch_size=batch_size)
    out.target = batch_size if target is None else target
    out._measure = lambda shipped: setattr(out, "_shipped_at", channels.perf_counter())   # no resizing here
    return out, inbox


def shipped(inbox):
    return [(kind, payload) for _ch, kind, payload in inbox.items]


def test_small_batches_wait_for_linger_then_go_as_one_with_the_newest_watermark(clock):
    async def main():
        out, inbox = channel()
        out.send([0])
        clock.now += 0.005             # its oldest tuple waited the target: it goes
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
        plain, plain_inbox = channel(latency_s=0)
        plain.send([1])
        plain.send([2])
        assert plain.data_pending() == 2 and plain.linger_left() is None
        await plain.flush(wait=False)
        assert shipped(plain_inbox) == [(DATA, [1]), (DATA, [2])]     # today's behaviour

    asyncio.run(main())


def test_batch_target_is_what_arrives_in_half_the_target_from_one_tuple_to_a_full_batch():
    assert channels.batch_target(0.0, 0.001, 1000) == 1               # nothing measured: at once
    assert channels.batch_target(1_000, 0.001, 1000) == 1             # 1 k/s: every tuple at once
    assert channels.batch_target(10_000, 0.001, 1000) == 5            # 10 k/s: 5 tuples, 0.5 ms
    assert channels.batch_target(700_000, 0.001, 1000) == 350
    assert channels.batch_target(5_000_000, 0.001, 1000) == 1000      # busy: full batches
    assert channels.batch_target(5_000_000, 0.0, 1000) == 1


def test_a_channel_sizes_its_batches_from_the_rate_it_ships(clock):
    """A trickle ships each tuple at once; a rate of 100 k/s (100 tuples a ms) makes batches of
    250 wait for more (half of a 5 ms target); the rate falling makes them small again."""
    async def main():
        out = LocalChannelOut("c1", 100, Inbox(), ChannelIn("c1", "src", "out"), latency_s=0.005, batch_size=1000)
        for _ in range(3):                       # 1 tuple a second: each goes at once
            out.send([1])
            assert out.can_ship() and await out.flush(wait=False)
            clock.now += 1.0
        assert out.target == 1 and out.batches == 3
        for _ in range(40):                      # 100 tuples a ms, each shipped (flush that waits)
            out.send(list(range(100)))
            await out.flush()
            clock.now += 0.001
        assert out.rate == pytest.approx(100_000, rel=0.05) and 240 <= out.target <= 250
        out.send(list(range(100)))
        assert not out.can_ship() and out.linger_left() == pytest.approx(0.005)
        clock.now += 0.001
        out.send(list(range(150)))               # 250: the batch the rate asks for
        assert out.can_ship()
        shipped_before = out.batches
        await out.flush(wait=False)
        assert out.batches == shipped_before + 1 and not out.pending
        for _ in range(24):                      # quiet again: a tuple every 100 ms
            clock.now += 0.1
            out.send([1])
            clock.now += 0.0051                  # (it waits the target while the rate falls)
            await out.flush(wait=False)
        assert out.target == 1 and out.can_ship() is False
        out.send([1])
        assert out.can_ship()

    asyncio.run(main())


def test_batches_shipped_back_to_back_do_not_read_as_an_endless_rate(clock):
    """A sample is capped at the rate that fills a batch (1000 tuples in 2.5 ms: 400 k/s), so one
    burst after a credit wait moves a 100 k/s channel's target a quarter of the way, not to full."""
    async def main():
        out = LocalChannelOut("c1", 100, Inbox(), ChannelIn("c1", "src", "out"), latency_s=0.005, batch_size=1000)
        for _ in range(40):
            out.send(list(range(100)))
            await out.flush()
            clock.now += 0.001
        assert 240 <= out.target <= 250
        out.send(list(range(100)))
        await out.flush()
        clock.now += 0.000001
        out.send(list(range(1000)))
        await out.flush()
        assert out.rate == pytest.approx(100_000 + 0.25 * 300_000, rel=0.05) and out.target < 500

    asyncio.run(main())


def test_a_watermark_ships_at_once_after_a_quiet_target_else_a_target_after_the_last_batch(clock):
    """A busy channel (target: full batches) holds 2 tuples; a watermark behind them makes them go
    at once when no batch went for a target, and a target after the last batch otherwise, not a
    target after their oldest tuple."""
    async def main():
        out, inbox = channel()
        out.send([1, 2])
        assert not out.can_ship()
        out.watermark(7)
        assert out.can_ship() and await out.flush(wait=False)       # nothing went before: at once
        assert shipped(inbox) == [(DATA, [1, 2]), (WATERMARK, 7)]
        clock.now += 0.004
        out.send([3])
        out.watermark(8)                        # 4 ms after the last batch: 1 ms more, not 5
        assert not out.can_ship() and out.linger_left() == pytest.approx(0.001)
        clock.now += 0.001
        assert out.can_ship() and await out.flush(wait=False)
        assert shipped(inbox)[2:] == [(DATA, [3]), (WATERMARK, 8)]
        clock.now += 0.001
        out.send([4])                           # no watermark behind it: a full target
        assert out.linger_left() == pytest.approx(0.005)

    asyncio.run(main())


class FireOnWatermark(Operator):
    """Holds what it takes and emits it when the watermark passes (a window's fire)."""

    name = "fire_on_watermark"

    def __init__(self):
        self.held = []

    def process(self, batch, emit):
        emit.many([t for t in batch if t["ts"] < 0])      # late ones pass through at once
        self.held += [t for t in batch if t["ts"] >= 0]

    def on_watermark(self, wm, emit):
        emit.many([t for t in self.held if t["ts"] <= wm])
        self.held = [t for t in self.held if t["ts"] > wm]


def test_what_a_window_fire_emits_leaves_at_once(clock):
    """A busy channel (target: full batches) right after a batch went: data the operator emits from
    a batch waits, what its watermark callback emits (a fire) goes at once, without waiting for
    the target after the last batch as a watermark alone would."""
    async def main():
        out, inbox = channel()
        chain = Chain({"w": FireOnWatermark()}, [("src", "out", "w")], {("w", "out"): [out]})
        chain.nodes["w"].op.open(OperatorContext(op_id="w"))
        await out.flush()                                    # nothing yet
        out.send([{"ts": -9}])
        await out.flush()                                    # a batch just went
        chain.emit_from("src", [{"ts": -1}, {"ts": 1}, {"ts": 2}])
        assert not out.can_ship()                            # the late one waits for more
        chain.watermark_from("src", 1)
        assert out.can_ship() and await out.flush(wait=False)
        assert shipped(inbox)[1:] == [(DATA, [{"ts": -1}, {"ts": 1}]), (WATERMARK, 1)]

    asyncio.run(main())


class OneAtATime(IterableSource):
    """Returns one item per read, whatever is asked: a paced source's reads at a low rate."""

    def read(self, n):
        return super().read(1)


def test_a_pe_ships_full_batches_from_small_reads_and_its_end_at_once():
    """On a real PE runner: a source returning one tuple a read (and advancing the watermark each
    time), ``batch.size`` 10 and a latency target of a minute. The first tuples go at once (the
    channel was quiet, its rate not yet measured), then batches of 10 (not one a tuple), in order,
    and the rest go with END at once: the PE ends within the test's bound, not after the target."""
    async def scenario():
        spec = PESpec("src", "dep", {"src": (OneAtATime, {"items": [{"n": i, "ts": i} for i in range(25)]}, None)}, [],
                      outputs=[OutputSpec("c-w", "src", "out", "pe-w", "tcp://w", HERE, ("w",))],
                      batch_size=10, latency_s=60.0)
        pe = PERunner(spec, Hosting("tcp://src"))
        inbox = Inbox()
        receiver = ChannelIn("c-w", "src", "out")
        await pe.connect(lambda cid: (inbox, receiver), HERE)
        receiver.grant = pe.ports.outs[0][1].gate.release          # the receiver takes every batch
        await asyncio.wait_for(pe.start(), 30)
        items = shipped(inbox)
        assert pe.state == "finished", pe.error
        sizes = [len(p) for k, p in items if k == DATA]
        assert sizes[:2] == [1, 1] and set(sizes[2:-1]) == {10} and sizes[-1] <= 10 and items[-1] == (END, None)
        assert [t["n"] for k, p in items if k == DATA for t in p] == list(range(25))
        wms = [p for k, p in items if k == WATERMARK]
        assert wms == sorted(set(wms)) and len(wms) <= len(sizes)     # only the newest behind each batch
        assert pe.state == "finished"
    asyncio.run(scenario())


class AllAtOnce(IterableSource):
    """Returns everything left in one read, whatever is asked."""

    def read(self, n):
        return super().read(1 << 30)


def test_a_fire_of_many_keys_leaves_in_slices_in_order_and_the_loop_runs_between():
    """On a real PE runner, ``batch.size`` 1000 and 2 credits: an operator's watermark callback
    emits 5,000 results at once (a window firing 5,000 keys). They leave as 5 slices of 1,000, in
    order, each on its own credit, and another task on the event loop runs between the first and
    the last slice (the PE does not hold the loop for the whole fire); what follows the fire
    (the watermark, the end) comes after its last slice."""
    n = 5000
    items = [{"n": i, "ts": 0} for i in range(n)] + [{"n": n, "ts": 10 ** 9}]

    async def scenario():
        spec = PESpec("src", "dep", {"src": (AllAtOnce, {"items": items, "max_delay": 0}, None),
                                     "w": (FireOnWatermark, {}, None)}, [("src", "out", "w")],
                      outputs=[OutputSpec("c-w", "w", "out", "pe-w", "tcp://w", HERE, ("w2",))],
                      batch_size=1000, latency_s=0.001, credits=2)
        pe = PERunner(spec, Hosting("tcp://src"))
        inbox = Inbox()
        receiver = ChannelIn("c-w", "w", "out")
        await pe.connect(lambda cid: (inbox, receiver), HERE)
        ticks, got = [0], []

        async def ticker():
            while True:
                ticks[0] += 1
                await asyncio.sleep(0)

        async def consume():
            while not got or got[-1][0] != END:
                await inbox.event.wait()
                inbox.event.clear()
                while inbox.items:
                    _ch, kind, payload = inbox.items.popleft()
                    got.append((kind, payload, ticks[0]))
                    if kind == DATA:
                        pe.ports.outs[0][1].gate.release()
                await asyncio.sleep(0)

        tick = asyncio.ensure_future(ticker())
        try:
            await asyncio.wait_for(asyncio.gather(pe.start(), consume()), 30)
        finally:
            tick.cancel()
        assert pe.state == "finished", pe.error
        data = [(p, t) for k, p, t in got if k == DATA]
        assert [len(p) for p, _t in data[:5]] == [1000] * 5
        assert [t["n"] for p, _t in data for t in p] == list(range(n + 1))
        assert data[4][1] > data[0][1]          # the loop ran other tasks while the fire shipped
        kinds = [k for k, _p, _t in got]
        assert kinds.index(WATERMARK) > 4 and kinds[-1] == END
    asyncio.run(scenario())

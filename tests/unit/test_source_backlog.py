"""A source stops reading once an output it feeds is out of credit with one batch buffered.

bench/kafka.py (e): with the rule for channel input (two credit windows buffered before the
channel counts as full, flow.py), the Kafka source read 16 batches ahead of the credit window
into the channel to the one instance of the hot map, where no copy could take them: 24,000
records, 24 s of that map's work, were the original's before the policy's copy started. Left
at the broker, they go to whichever instance has credit. Here on a real PE runner with an
in-memory channel (as test_credit_routing does).
"""

from __future__ import annotations

import asyncio

from pescheduler.operators.sources import IterableSource
from pescheduler.worker.channels import DATA, ChannelIn, Inbox
from pescheduler.worker.flow import RELIEF_BATCHES, SOURCE_BACKLOG
from pescheduler.worker.runtime import Hosting, PERunner
from pescheduler.wire import OutputSpec, PESpec

HERE = "127.0.0.1:1"


class BrokerLike(IterableSource):
    """An iterable whose unread items stand for a broker's backlog (as PartitionedSource says)."""

    backlog_elsewhere = True


def _pe(source_cls):
    spec = PESpec("src", "dep", {"src": (source_cls, {"items": [{"n": i, "ts": i} for i in range(100_000)]}, None)},
                  [], outputs=[OutputSpec("c-w", "src", "out", "pe-w", "tcp://w", HERE, ("w",))], batch_size=100)
    return spec, PERunner(spec, Hosting("tcp://src"))


async def _connected(pe):
    inbox = Inbox()
    await pe.connect(lambda cid: (inbox, ChannelIn(cid, "src", "out")), HERE)
    for op_id, op in pe.ops.items():
        op.open(type("Context", (), {"op_id": op_id, "extra": {}})())
    return pe.ports.outs[0][1]


def test_a_source_waits_with_one_batch_buffered_past_the_credit_window_and_reads_on_with_credit():
    async def scenario():
        spec, pe = _pe(BrokerLike)
        out = await _connected(pe)
        for _ in range(5 * spec.credits):               # the PE's loop: read, then ship what credit allows
            pe.sources.pump(pe.chain, pe.inputs.source_held)
            await pe.inputs.flush()
        assert out.tuples == spec.credits * 100, "the credit window went out"
        assert out.data_pending() == 1, "one batch waits; the rest stays in the source"
        assert pe.inputs.source_held(pe.sources[0]) and pe.inputs.full == frozenset(), \
            "the source waits; the channel is not full for flow.py's rule (input from channels)"
        out.gate.release(2)                               # the receiver took two batches
        for _ in range(5):
            pe.sources.pump(pe.chain, pe.inputs.source_held)
            await pe.inputs.flush()
        assert out.tuples == (spec.credits + 2) * 100 and out.data_pending() == SOURCE_BACKLOG
    asyncio.run(scenario())


def test_a_source_without_a_backlog_elsewhere_reads_ahead_as_channel_input_does():
    """A generator's items exist only once read: reading ahead keeps a fast pipeline fed (bench/
    parallel.py's copy speed-up fell from 1.6-1.8x to 0.9-1.5x when its counter stopped at one)."""
    async def scenario():
        spec, pe = _pe(IterableSource)
        out = await _connected(pe)
        for _ in range(5 * spec.credits):
            pe.sources.pump(pe.chain, pe.inputs.source_held)
            await pe.inputs.flush()
        assert out.data_pending() == RELIEF_BATCHES * spec.credits and pe.inputs.full == frozenset({"src"})
    asyncio.run(scenario())


def test_a_source_feeding_a_held_channel_stops_at_a_full_channels_backlog_until_the_rewire():
    """A reconfiguration holds the channel to a PE it replaces until the rewire: what is emitted
    meanwhile waits in the channel. A source reads into it up to a full channel's backlog, then
    waits; before, it read on for the whole pause (160,000 tuples behind a Fuse whose pause waited
    8 s for a slow consumer, and the stop's drain of them outran its bound in CI)."""
    async def scenario():
        spec, pe = _pe(IterableSource)
        out = await _connected(pe)
        out.hold("marker")
        await pe.inputs.flush()
        assert out.held, "the marker went; the channel waits for the rewire"
        for _ in range(5 * spec.credits):
            pe.sources.pump(pe.chain, pe.inputs.source_held)
            await pe.inputs.flush()
        assert out.data_pending() == RELIEF_BATCHES * spec.credits, "the source read past the bound"
        assert pe.inputs.source_held(pe.sources[0]) and pe.inputs.parked == frozenset({"src"})
        held = out.take_held()                  # the rewire takes what the channel held
        assert sum(1 for kind, _ in held if kind == DATA) == RELIEF_BATCHES * spec.credits
        assert await pe.inputs.flush(), "the parked source is told it may read again"
        assert not pe.inputs.source_held(pe.sources[0])
    asyncio.run(scenario())

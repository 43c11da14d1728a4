"""One PE's ends of its data channels: the inbox its input channels fill, those channels by id,
and its output channels, opened here (in memory to a receiver on the same worker, else TCP).

Kept apart from the runner because every part of the PE uses them: the loop
takes from the inbox, the input scheduler (flow.py) gates on the outputs'
credit, a checkpoint (barriers.py) parks and puts back input, a
reconfiguration (rewirer.py) re-points the outputs in place, and the PE host
(pehost.py) finds a channel's receiving end here when its sender connects.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable

from ..wire import OutputSpec, PESpec
from .channels import ChannelIn, ChannelOut, Inbox, LocalChannelOut, TcpChannelOut
from .handshake import Credentials

Lookup = Callable[[str], tuple[Inbox, ChannelIn]]
Connect = tuple[Lookup, str, Callable[[str], Any] | None]
"""How output channels reach their receivers: the lookup of receivers on this worker, this
worker's data address, and how to wait for a receiver here that is not there yet (None: a
KeyError instead)."""


class Ports:
    """The inbox, the input channels (``receivers``, by id) and the output channels (``outs``) of
    one PE; ``dead(item, exc, op_id)`` takes what a TCP channel could not deliver."""

    def __init__(self, spec: PESpec, credentials: Credentials | None,
                 dead: Callable[[Any, BaseException | str, str], None]) -> None:
        self.spec, self.credentials, self.dead = spec, credentials, dead
        self.inbox = Inbox()
        self.receivers = {i.channel_id: ChannelIn(i.channel_id, i.src_op, i.port) for i in spec.inputs}
        self.outs: list[tuple[OutputSpec, ChannelOut]] = []      # rewired in place (rewirer.py)

    def receiver(self, channel_id: str) -> tuple[Inbox, ChannelIn]:
        """The inbox and receiving end of input channel ``channel_id`` (KeyError: not this PE's)."""
        return self.inbox, self.receivers[channel_id]

    def wake(self) -> None:
        """Wake the PE's loop from its idle wait (input, credit, a control call)."""
        self.inbox.event.set()

    def put_back(self, items: Iterable[tuple[ChannelIn, int, Any]]) -> None:
        """Items taken off the inbox (parked at a barrier) go back in front of it, in their order."""
        self.inbox.items.extendleft(reversed(list(items)))

    def open(self, connect: Connect) -> dict[tuple[str, str], list[ChannelOut]]:
        """Begin opening every output channel of the spec; answers them by producer and port (the
        chain's outputs). The PE may start before they are open (ChannelOut.open_in_background)."""
        outputs: dict[tuple[str, str], list[ChannelOut]] = {}
        for out in self.spec.outputs:
            channel = self.open_channel(out, connect)
            self.outs.append((out, channel))
            outputs.setdefault((out.src_op, out.port), []).append(channel)
        return outputs

    def open_channel(self, out: OutputSpec, connect: Connect) -> ChannelOut:
        """Begin opening one output channel (not added to ``outs``: a rewire does that)."""
        local_receivers, data_address, expect = connect
        spec = self.spec
        if out.dst_data == data_address:
            channel = LocalChannelOut(out.channel_id, spec.credits, latency_s=spec.latency_s,
                                      batch_size=spec.batch_size)
            try:
                channel.attach(*local_receivers(out.channel_id))
            except KeyError:
                if expect is None:
                    raise
                channel.attach_later(expect)
        else:
            channel = TcpChannelOut(out.channel_id, spec.credits,
                                    lambda item, exc, op=out.src_op: self.dead(item, exc, op),
                                    latency_s=spec.latency_s, batch_size=spec.batch_size)
            channel.open(out.dst_data, self.credentials)
        channel.dst_ops = out.dst_ops          # routers pick channels by the instance they reach
        channel.gate.wake = self.wake          # credit wakes an idle PE (flow.InputScheduler.idle)
        return channel

    async def opened(self) -> None:
        """Return once every output channel is open; raise why one could not open."""
        await asyncio.gather(*(channel.opened() for _spec, channel in self.outs))

    async def flush(self) -> None:
        """Ship everything buffered, waiting for credit (every input ended: nothing to defer), until
        no channel that is not held has anything left: a rewire while this waits for credit puts
        new channels in, with the END it re-sends (``Rewirer._replay``), where a pass begun before
        it would not look (the PE's end, ``PERunner.run``)."""
        while left := [channel for _spec, channel in self.outs if channel.pending and not channel.held]:
            for channel in left:
                await channel.flush()

    async def close(self) -> None:
        """Close the channels there are now (a rewire meanwhile closes what it removes and ships, then
        closes, what it adds: ``PERunner.rewire``)."""
        for _spec, channel in list(self.outs):
            await channel.close()

    def outputs_of(self, op_id: str) -> list[ChannelOut]:
        """The output channels operator ``op_id`` feeds."""
        return [channel for spec, channel in self.outs if spec.src_op == op_id]

    def linger_waits(self) -> list[float]:
        """How long each lingering output channel still waits before it ships (its idle bound)."""
        return [left for _s, ch in self.outs if not ch.held and (left := ch.linger_left())]

    def stats(self, marked: list[dict[str, float]]) -> dict:
        """The inbox's and the channels' counters (``marked``: the markers seen, per channel)."""
        inbox = self.inbox
        return {
            "backpressure_s": sum(ch.gate.blocked_s for _s, ch in self.outs),
            "queue_batches": inbox.data_batches, "max_queue_batches": inbox.max_data_batches,
            "queue_tuples": inbox.queued_tuples(),
            "channels_out": {ch.channel_id: {"tuples": ch.tuples, "batches": ch.batches, "credits": ch.gate.credits,
                                             "pending": len(ch.pending), "held": ch.held, "head": ch.head()}
                             for _s, ch in self.outs},
            "channels_in": {c.channel_id: {"tuples": c.tuples, "ended": c.ended,
                                           "marked": any(c.channel_id in seen for seen in marked)}
                            for c in self.receivers.values()},
        }

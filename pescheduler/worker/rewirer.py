"""How a reconfiguration changes a PE that stays: hold its outputs behind a marker, re-point them,
register its new inputs (the PE's side of ``control/protocol.py``'s last round).

Beside aligner.py, which brings a PE to the marker; this module is what
happens to the PE's channels once it is there.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ..wire import InputSpec, OutputSpec
from .aligner import Aligner
from .chain import MIN_WATERMARK
from .channels import DATA, END, WATERMARK, ChannelIn, ChannelOut, Inbox
from .flow import InputScheduler


class Rewirer:
    """Holds, re-points and registers one PE's channels (``outs`` and ``receivers`` are the PE's
    own, changed in place; ``chain`` is set once the PE built it)."""

    def __init__(self, outs: list[tuple[OutputSpec, ChannelOut]], receivers: dict[str, ChannelIn],
                 inbox: Inbox, aligner: Aligner, inputs: InputScheduler) -> None:
        self.outs, self.receivers, self.inbox, self.aligner, self.inputs = outs, receivers, inbox, aligner, inputs
        self.chain: Any = None

    def hold(self, channel_ids: list[str], marker: Any, overtake: Iterable[str] = ()) -> None:
        """Send ``marker`` on these output channels, then hold them until rewired; the
        operators feeding them hold back their watermarks and end too (Chain.freeze).
        On the ``overtake`` ones the marker goes ahead of what they buffer (ChannelOut.hold)."""
        overtake = set(overtake)
        for spec, channel in self.outs:
            if channel.channel_id in channel_ids:
                overtaken_wm = channel.hold(marker, overtake=channel.channel_id in overtake)
                self.chain.freeze([spec.src_op], overtaken_wm)
        self.inbox.event.set()

    async def rewire(self, outputs: list[OutputSpec], remove: list[str], open_channel: Callable[[OutputSpec], ChannelOut],
                      routing: dict | None = None, copies: dict[str, str] | None = None) -> None:
        """Replace held output channels by new ones (``open_channel``) and install new routers;
        what the old channels held goes on along the new routes.

        New channels begin to open first, and the PE does not wait for them
        (their data waits in them until open: the PE's ``opened`` is awaited by the
        caller, outside the PE's turn). From taking the held items to switching
        the routes there is no ``await``: the PE loop must not emit into a
        channel that is being replaced, or what it emits would be lost. Held
        data is re-sent through the new route to the operator the old channel
        served (its router when that operator has copies), so a batch held for
        a released copy reaches the instances that remain, and a batch held
        for a KEYED operator is split by the new key-group owners.
        """
        opened = [(out, open_channel(out)) for out in outputs]
        olds = [(spec, ch) for spec, ch in self.outs if ch.channel_id in remove]
        held = {ch.channel_id: ch.take_held() for _spec, ch in olds}
        served = {ch.channel_id: list(dict.fromkeys(self.chain.logical(d) for d in ch.dst_ops)) for _s, ch in olds}
        self.outs[:] = [(spec, ch) for spec, ch in self.outs if ch.channel_id not in remove] + opened
        self.chain.rewire([ch for _s, ch in olds], [(out.src_op, out.port, ch) for out, ch in opened],
                          routing, copies)
        sent: dict[Any, set[int]] = {}         # target -> ids of batches replayed to it
        ended: set[str] = set()
        for spec, old in olds:
            news = [ch for out, ch in opened if (out.src_op, out.port) == (spec.src_op, spec.port)]
            targets = list(dict.fromkeys(call for x in served[old.channel_id]
                                         for call in self.chain.consumer_routes.get((spec.src_op, spec.port, x), ())))
            self._replay(held[old.channel_id], old, news, targets, sent, ended)
        self.chain.thaw()                      # watermarks held back since the hold: behind the data
        self.inbox.event.set()
        for _spec, old in olds:
            await old.close(timeout=0)

    @staticmethod
    def _replay(items: list, old: ChannelOut, news: list[ChannelOut], targets: list, sent: dict,
                ended: set[str]) -> None:
        """What ``old`` held, on along the new routes: data to the operators it served, the rest
        (and the end) on the new channels of its port."""
        for kind, payload in items:
            if kind == DATA:
                # Fan-out channels held the very same batch objects: a new channel that now
                # serves what several old ones did gets each batch once.
                for target in targets:
                    seen = sent.setdefault(target, set())
                    if id(payload) not in seen:
                        seen.add(id(payload))
                        target(payload)
            elif kind == END:
                _end(news, ended)
            else:
                for channel in news:
                    _replay(channel, kind, payload)
        if old.ended and all(kind != END for kind, _ in items):
            _end(news, ended)                  # END went out before the hold: the new path needs it too

    def set_inputs(self, add: list[InputSpec], remove: list[str], edges: list | None = None,
                       copies: dict[str, str] | None = None) -> None:
        """Register new input channels, forget removed ones, and (``edges``) the chain's new inputs."""
        if copies:
            self.chain.rewire(copies=copies)
        for spec in add:
            self.receivers[spec.channel_id] = ChannelIn(spec.channel_id, spec.src_op, spec.port)
        for channel_id in remove:
            self.receivers.pop(channel_id, None)
        self.aligner.forget(remove)
        if edges is not None:
            self.chain.set_edges(edges, initial_wm=MIN_WATERMARK)
        self.inputs.edges_changed()


def _end(channels: list[ChannelOut], ended: set[str]) -> None:
    """END on each of ``channels`` not ended yet by this rewire."""
    for channel in channels:
        if channel.channel_id not in ended:
            ended.add(channel.channel_id)
            channel.end()


def _replay(channel: ChannelOut, kind: int, payload: Any) -> None:
    """Re-emit one held item on a replacement channel."""
    if kind == DATA:
        channel.send(payload)
    elif kind == WATERMARK:
        channel.watermark(payload)
    elif kind == END:
        channel.end()

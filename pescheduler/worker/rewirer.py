"""The PE's side of a reconfiguration (``control/protocol.py``): a PE being replaced aligns on the
marker and holds its outputs behind it; a PE that stays holds the outputs into the PEs being
replaced behind the marker, then has them re-pointed and its new inputs registered; and either
tells how far it is (:meth:`Rewirer.status`, what the drain waits on).

Beside aligner.py, which decides when a PE is at the marker; this module is
what happens to the PE's sources and channels then.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ..wire import InputSpec, OutputSpec
from .aligner import Aligner
from .chain import MIN_WATERMARK
from .channels import DATA, END, WATERMARK, ChannelIn, ChannelOut
from .flow import InputScheduler
from .ports import Ports
from .source_driver import Sources
from .turns import Turns


class Rewirer:
    """Aligns, holds, re-points and registers one PE's sources and channels (``ports`` are the
    PE's own, changed in place; ``chain`` is set once the PE built it)."""

    def __init__(self, ports: Ports, aligner: Aligner, inputs: InputScheduler, sources: Sources,
                 turns: Turns) -> None:
        self.ports, self.aligner, self.inputs, self.sources, self.turns = ports, aligner, inputs, sources, turns
        self.chain: Any = None
        self.pending: dict[str, Any] = {}      # op -> its PendingGroups: moved key groups on their way
        self.early: dict[str, ChannelOut] = {}  # channel id -> a new output opened before the pause (open)
        self.carried: Any = None                # a released copy's queued input, per key group (carried_input.py)

    def align(self, marker: Any, release: bool = False, overdraw: Iterable[str] = ()) -> None:
        """Pause the PE's sources and align its operators on ``marker`` (see aligner.py); the PE
        then checks the alignment (``PERunner.check_aligned``).

        ``release``: the PE is a copy going away; once aligned, a MERGEABLE
        copy sends every partial it holds to its original, ahead of the marker.
        ``overdraw``: output channels that from now on ship without waiting for credit
        (``CreditGate.overdraw``): never full, they do not hold the PE's input, marker included,
        behind the consumer's pace (flow.py).
        """
        self.sources.pause()
        overdraw = set(overdraw)
        for _spec, channel in self.ports.outs:
            if channel.channel_id in overdraw:
                channel.gate.overdraw()
        self.aligner.begin(marker, lambda op_id: self._op_aligned(op_id, marker, release))

    def _op_aligned(self, op_id: str, marker: Any, release: bool) -> None:
        """``op_id`` aligned: its output channels carry the marker on, then hold."""
        if release and self.chain.nodes[op_id].partial:
            self.chain.release_partials()
        for channel in self.ports.outputs_of(op_id):
            channel.hold(marker)
        # Wake the loop so the marker ships now: another PE may need it
        # before it can send what this PE's other operators wait for.
        self.turns.on_loop(self.ports.wake)

    def hold(self, channel_ids: list[str], marker: Any, overtake: Iterable[str] = ()) -> None:
        """Send ``marker`` on these output channels, then hold them until rewired; the
        operators feeding them hold back their watermarks and end too (Chain.freeze).
        On the ``overtake`` ones the marker goes ahead of what they buffer (ChannelOut.hold)."""
        overtake = set(overtake)
        for spec, channel in self.ports.outs:
            if channel.channel_id in channel_ids:
                overtaken_wm = channel.hold(marker, overtake=channel.channel_id in overtake)
                self.chain.freeze([spec.src_op], overtaken_wm)
        self.ports.wake()

    def open(self, outputs: list[OutputSpec], open_channel: Callable[[OutputSpec], ChannelOut]) -> list[ChannelOut]:
        """Begin opening new output channels before the pause, with nothing routed to them: a
        later :meth:`rewire` naming them takes them as they are instead of opening them then, so
        the pause holds no connect (a copy's channels took 44-143 ms of a loaded Replicate's pause).
        They are not in ``ports.outs`` until then: no router, watermark or end reaches them."""
        fresh = [out for out in outputs if out.channel_id not in self.early]
        self.early.update((out.channel_id, open_channel(out)) for out in fresh)
        return [self.early[out.channel_id] for out in outputs]

    async def rewire(self, outputs: list[OutputSpec], remove: list[str], open_channel: Callable[[OutputSpec], ChannelOut],
                      routing: dict | None = None, copies: dict[str, str] | None = None) -> None:
        """Replace held output channels by new ones (``open_channel``) and install new routers;
        what the old channels held goes on along the new routes.

        New channels begin to open first (unless :meth:`open` did, before the pause), and the PE does not wait for them
        (their data waits in them until open: the PE's ``opened`` is awaited by the
        caller, outside the PE's turn). From taking the held items to switching
        the routes there is no ``await``: the PE loop must not emit into a
        channel that is being replaced, or what it emits would be lost. Held
        data is re-sent through the new route to the operator the old channel
        served (its router when that operator has copies), so a batch held for
        a released copy reaches the instances that remain, and a batch held
        for a KEYED operator is split by the new key-group owners.
        """
        opened = [(out, self.early.pop(out.channel_id, None) or open_channel(out)) for out in outputs]
        outs = self.ports.outs
        olds = [(spec, ch) for spec, ch in outs if ch.channel_id in remove]
        held = {ch.channel_id: ch.take_held() for _spec, ch in olds}
        served = {ch.channel_id: list(dict.fromkeys(self.chain.logical(d) for d in ch.dst_ops)) for _s, ch in olds}
        outs[:] = [(spec, ch) for spec, ch in outs if ch.channel_id not in remove] + opened
        self.chain.rewire([ch for _s, ch in olds], [(out.src_op, out.port, ch) for out, ch in opened],
                          routing, copies)
        sent: dict[Any, set[int]] = {}         # target -> ids of batches replayed to it
        ended: set[str] = set()
        for spec, old in olds:
            news = [ch for out, ch in opened if (out.src_op, out.port) == (spec.src_op, spec.port)]
            targets = list(dict.fromkeys(call for x in served[old.channel_id]
                                         for call in self.chain.consumer_routes.get((spec.src_op, spec.port, x), ())))
            self._replay(held[old.channel_id], old, news, targets, sent, ended)
        # Every new route from an operator whose END went out already (before the hold) gets one,
        # behind what was re-sent: one replacing a held channel, and one added beside the ones
        # kept (a copy of the consumer of a source that ended as the Replicate was planned), whose
        # copy would otherwise wait for ever and a Release of it hold the channel behind its marker.
        _end([ch for out, ch in opened if self.chain.end_sent(out.src_op)], ended)
        self.chain.thaw()                      # watermarks held back since the hold: behind the data
        self.ports.wake()
        for _spec, old in olds:
            await old.close(timeout=0)

    @staticmethod
    def _replay(items: list, old: ChannelOut, news: list[ChannelOut], targets: list, sent: dict,
                ended: set[str]) -> None:
        """What ``old`` held, on along the new routes: data to the operators it served, the rest
        (and an END it held) on the new channels of its port; an END that went out before the
        hold is the caller's (``Chain.end_sent``)."""
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

    def set_inputs(self, add: list[InputSpec], remove: list[str], edges: list | None = None,
                       copies: dict[str, str] | None = None) -> None:
        """Register new input channels, forget removed ones, and (``edges``) the chain's new inputs."""
        if copies:
            self.chain.rewire(copies=copies)
        receivers = self.ports.receivers
        for spec in add:                       # registered before the pause already: its sender may be connected
            if spec.channel_id not in receivers:
                receivers[spec.channel_id] = ChannelIn(spec.channel_id, spec.src_op, spec.port, wired=False)
        for channel_id in remove:
            receivers.pop(channel_id, None)
        self.aligner.forget(remove)
        if edges is not None:
            self.chain.set_edges(edges, initial_wm=MIN_WATERMARK)     # a gate's held input stays
        self.inputs.edges_changed()
        routes = self.chain.routes
        wired = [c for c in receivers.values() if not c.wired and (c.src_op, c.port) in routes]
        for channel in wired:                  # its items waited in the inbox for this edge
            channel.wired = True
        if wired:
            self.ports.wake()

    def status(self, marker: Any, channel_ids: list[str] | None = None, queued: Iterable[str] = ()) -> dict:
        """How far this PE is with ``marker``: ``missing``, ``progress`` and ``times`` of channel
        ids or ``"aligned"`` (see ``PEHost.pe_reconf_wait``). ``channel_ids`` None: the whole PE
        aligns (it is replaced); else it takes the marker from those channels (it stays).
        ``progress`` grows with every batch taken or shipped ahead of the marker (the drain count).

        ``queued``: channels among ``channel_ids`` whose marker need only be in the inbox (all
        they carried before it here, in order; ``queued`` says when), not taken: a Release's
        copy may stop then, and the PE works off its last batches after the pause
        (``protocol.ReconfigurationPlan.late_seen``)."""
        aligner, receivers, outs = self.aligner, self.ports.receivers, self.ports.outs
        arrived = dict(aligner.seen.get(marker, {}))
        if channel_ids is None:
            progress = sum(c.tuples for c in list(receivers.values())) + sum(d.count for d in self.sources)
            progress += len(aligner.aligned_ops) + len(arrived) + sum(ch.batches for _s, ch in list(outs))
            if aligner.aligned and aligner.aligned_at is not None:
                arrived["aligned"] = aligner.aligned_at
            return {"missing": [] if aligner.aligned else ["aligned"], "progress": progress, "times": arrived}
        here = {c: r.queued_at for c in queued if c not in arrived
                and (r := receivers.get(c)) is not None and r.queued == marker}
        missing = [c for c in channel_ids
                   if c not in arrived and c not in here and not getattr(receivers.get(c), "ended", True)]
        progress = sum(getattr(receivers.get(c), "tuples", 0) + (c in arrived) + (c in here) for c in channel_ids)
        return {"missing": missing, "progress": progress + self.inputs.shipped_toward(receivers, channel_ids),
                "times": {c: at for c, at in arrived.items() if c in channel_ids}, **({"queued": here} if queued else {})}


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

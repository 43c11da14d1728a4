"""Marker alignment for one PE: where a reconfiguration marker (and, next, a checkpoint
barrier) is aligned.

Chandy-Lamport snapshots as Flink aligns checkpoint barriers: a marker
travels in-band behind all data before it; an operator is *aligned* once
every one of its inputs delivered the marker (or ended, or is a paused
source's), and only then do its own outputs carry the marker on. A channel
that delivered the marker is blocked until the alignment finishes: what
arrives on it after the marker belongs to the next epoch, so it is parked
here and handed back by :meth:`Aligner.finish`. (A reconfiguration's senders
hold their channels after the marker, so nothing is parked then; a checkpoint
barrier's senders go on, and parking is what keeps the snapshot consistent.)

Alignment goes operator by operator, in topological order, not by whole PE:
fused non-adjacent operators can make two PEs feed each other (the operator
graph has no cycle; the PE graph can), and whole-PE alignment would deadlock.

The aligner decides; the PE acts (holds its output channels, releases a
copy's partials, wakes its loop) through the ``on_op`` callback given to
:meth:`Aligner.begin`.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:
    from .chain import Chain, Node
    from .channels import ChannelIn


KEEP_MARKERS = 8     # markers remembered at most (the one being aligned on is always kept)


class Aligner:
    """The markers a PE has seen on its inputs, and its alignment on one of them.

    ``seen`` is bounded: a PE that stays while a neighbour is replaced notes the
    marker on its input from that neighbour (the drain waits for it) and never
    aligns on it, so nothing would ever drop the entry: one per reconfiguration,
    for the life of the run. Removing the input forgets it (:meth:`forget`), and
    no more than ``KEEP_MARKERS`` markers are kept in any case: reconfigurations
    run one at a time, so only the newest can still be waited for.
    """

    def __init__(self) -> None:
        self.seen: dict[Any, dict[str, float]] = {}    # marker -> input channel -> when it arrived
        self.marker: Any = None                    # the marker being aligned on (None: not aligning)
        self.aligned_ops: set[str] = set()
        self.aligned = False                       # every operator of the PE is aligned
        self.aligned_at: float | None = None       # wall clock of the last alignment (where a drain went)
        self.parked: deque = deque()               # (channel, kind, payload) from blocked channels
        self._on_op: Callable[[str], None] = lambda op_id: None

    def arrived(self, channel_id: str, marker: Any) -> None:
        """``marker`` arrived on ``channel_id``, behind all data sent before it."""
        if marker not in self.seen:
            self.seen[marker] = {}
            for old in [m for m in self.seen if m != self.marker][:-KEEP_MARKERS]:
                del self.seen[old]              # oldest first (dicts keep insertion order)
        self.seen[marker].setdefault(channel_id, time.time())

    def forget(self, channel_ids: Iterable[str]) -> None:
        """These input channels are gone: drop what they delivered, and markers left with none."""
        gone = set(channel_ids)
        for marker in list(self.seen):
            channels = self.seen[marker]
            for channel_id in gone & channels.keys():
                del channels[channel_id]
            if not channels and marker != self.marker:
                del self.seen[marker]

    def has_seen(self, marker: Any, channel_id: str) -> bool:
        return channel_id in self.seen.get(marker, ())

    def begin(self, marker: Any, on_op: Callable[[str], None]) -> None:
        """Align on ``marker``; ``on_op(op_id)`` runs as each operator aligns (in topological order)."""
        self.marker = marker
        self._on_op = on_op

    def advance(self, chain: "Chain", receivers: Iterable["ChannelIn"]) -> bool:
        """Align every operator whose inputs are now aligned; True when the whole PE just aligned.

        An input is aligned when it is a local upstream that aligned, a
        channel that delivered the marker or ended, or an input that already
        ended (a paused source has none left).
        """
        if self.marker is None or self.aligned:
            return False
        seen = self.seen.get(self.marker, {})
        receivers = list(receivers)
        for op_id, node in chain.nodes.items():
            if op_id in self.aligned_ops:
                continue
            if all(self._input_aligned(chain, receivers, node, upstream, seen) for upstream in node.in_wm):
                self.aligned_ops.add(op_id)
                self._on_op(op_id)
        if len(self.aligned_ops) == len(chain.nodes):
            self.aligned, self.aligned_at = True, time.time()
            return True
        return False

    def _input_aligned(self, chain: "Chain", receivers: list["ChannelIn"], node: "Node", upstream: str,
                       seen: dict[str, float]) -> bool:
        if upstream in chain.nodes:
            return upstream in self.aligned_ops
        if upstream not in node.open_inputs:
            return True
        return all(c.channel_id in seen or c.ended for c in receivers if c.src_op == upstream)

    def park(self, channel: "ChannelIn", kind: int, payload: Any) -> bool:
        """Set aside an item from a channel blocked at the marker; False if the channel is open."""
        if self.marker is None or channel.channel_id not in self.seen.get(self.marker, ()):
            return False
        self.parked.append((channel, kind, payload))
        return True

    def finish(self) -> list[tuple["ChannelIn", int, Any]]:
        """End the alignment (the snapshot is taken): channels unblock; what they parked is
        returned, in arrival order, to be processed before anything newer."""
        parked = list(self.parked)
        self.seen.pop(self.marker, None)
        self.marker, self.aligned, self.aligned_ops = None, False, set()
        self.parked.clear()
        self._on_op = lambda op_id: None
        return parked

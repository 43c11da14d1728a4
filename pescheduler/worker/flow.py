"""What a PE may take in while one of its output channels is full: no credit deadlock.

The operator graph has no cycle, but the PE graph can: fusing non-adjacent
operators makes two PEs feed each other, and a copy of a MERGEABLE operator
(a window) sends its partials back to the PE of its original, which feeds the
copy. With credit-based channels, a PE that stops taking input while it waits
for credit on an output stops granting credit to its senders; around such a
cycle each PE then waits for the other forever (issue 20: a copied window at
overload, every PE at backpressure 1.0, 0 tuples/s).

The rule, applied by the PE loop: an output channel is *full* when it is out
of credit with ``RELIEF_BATCHES`` credit windows buffered. While some are,
the PE keeps taking every input (channel or source) except those whose
operators reach the producer of a full channel inside the PE (taking those
would grow the full channel's buffer without bound); the others it takes,
and grants their credit, as usual.

Why this cannot deadlock: say PEs ``P1 .. Pn = P1`` each wait on the next,
``Pi`` with a full channel from its operator ``u_i`` to ``v_i`` in ``P(i+1)``,
which does not take it. By the rule ``v_i`` reaches ``u_(i+1)`` inside
``P(i+1)``, so ``u_1 -> v_1 ->* u_2 -> v_2 ->* ... ->* u_1`` is a cycle of the
operator graph, which has none (a copy's partials go to its original, which
feeds nothing back to the copy). tests/unit/test_flow.py checks this on every
placement random transforms produce, with this very function.

With the Aligner (aligner.py): an aligning PE parks what a channel brings
after its marker and grants no credit for it, which could starve a sender
this rule counts on. A reconfiguration never parks: every input of a PE being
replaced is held by its sender right after the marker, and a held channel is
never full (it waits for the rewire, not for credit), so markers travel as
batches do in the model above (tests/unit/test_flow.py checks the holds on
every reconfiguration random transforms produce). A checkpoint barrier, whose
senders go on, parks by design; it must keep to the same argument.

What a held channel buffers until the rewire is bounded for sources only: a
source that feeds a held channel with a full channel's backlog (``parked``)
reads nothing more until the rewire. No marker waits on a source, so this
keeps the argument. A channel input feeding a held channel is still taken: a
PE that stopped taking it could hold back a PE being replaced, whose drain the
rewire waits for. Unbounded, a source at 20,000 tuples/s upstream of a Fuse
whose pause waited 8 s for a slow consumer's backlog put 160,000 tuples into
the held channel, and the stop's drain of them outran its 180 s bound (CI).
The parked source's wait is idle time, not backpressure (the gate it would be
counted on goes at the rewire); a pause shorter than the bound takes to fill
at the source's rate (16,000 tuples: 0.8 s at 20,000/s) changes nothing.

:class:`InputScheduler` is the rule as the PE loop runs it, with the choice
between inputs that are all free to go (fair shares of the PE's busy time).
"""

from __future__ import annotations

import asyncio
from functools import partial
from time import perf_counter
from typing import Any, Callable, ContextManager, Iterable

from .channels import DATA, ChannelIn, ChannelOut, Inbox
from .turns import thread_after

RELIEF_BATCHES = 2       # backlog (in credit windows) that makes an out-of-credit channel full
SOURCE_BACKLOG = 1       # batches buffered on an out-of-credit channel that stop a broker source feeding it

Edge = tuple[str, str, str]          # (producer, port, consumer) with the consumer in the PE


def downstream(edges: Iterable[Edge], start: Iterable[str]) -> set[str]:
    """``start`` and every operator reachable from it along ``edges``."""
    succ: dict[str, set[str]] = {}
    for src, _port, dst in edges:
        succ.setdefault(src, set()).add(dst)
    seen = set(start)
    todo = list(seen)
    while todo:
        for nxt in succ.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def feeds(edges: list[Edge], members: Iterable[str], op_id: str, port: str, full: Iterable[str]) -> bool:
    """Would taking ``op_id.port``'s input (a channel from another PE, or ``op_id`` itself when it
    is a source among ``members``) emit, inside the PE, into an output of an operator in ``full``?"""
    full = set(full)
    if not full:
        return False
    start = [op_id] if op_id in set(members) else [d for s, p, d in edges if s == op_id and p == port]
    return not full.isdisjoint(downstream(edges, start))


SLICE_MIN = 250     # the fewest tuples a slice of a batch takes (why: slice_size)


def slice_size(n: int, tuple_s: float, left_s: float, whole_s: float) -> int:
    """How many of a data batch's ``n`` tuples a turn with ``left_s`` left takes, at ``tuple_s``
    busy time a tuple (the channel's last batch's): all that fit, at least :data:`SLICE_MIN`;
    every one when they all fit, when nothing was measured yet (also with the turn's time
    already used up), or when the whole batch would take longer than ``whole_s``, the turn that
    sends a PE to a thread of its own (turns.py): an operator that blocks shows it in one turn
    and moves, instead of running short turns on the worker's loop (test_monitor's map, 0.5 ms
    a tuple, never moved and counted 0.65 busy with slices of 32).

    Why at least 250: a slice's reads and writes cost more per key the fewer keys they take
    (a disk store holding 10^7 keys, ``get_many`` + ``write_many`` of random keys in process:
    20.0-22.8 us a key at 1,000, 23.4-26.7 at 250, 25.8-33.6 at 100), and with slices of 32 the
    table's state PE fell behind (session 37: a median gap between outputs of 9 ms against 0.9)."""
    if n <= SLICE_MIN or tuple_s <= 0.0 or n * tuple_s <= left_s or n * tuple_s > whole_s:
        return n
    return max(SLICE_MIN, int(left_s / tuple_s))


class InputScheduler:
    """One PE's input choice and flow gating: which inbox item it takes next, which input (a
    channel's producer, or a source here) it holds back for a full output channel, and when the
    wait for credit is backpressure.

    ``outs`` is the PE's own list of ``(OutputSpec, ChannelOut)`` (rewired in place);
    ``park(channel, kind, payload)`` keeps an item behind an alignment marker (True: kept);
    ``handle(channel, kind, payload)`` processes one item taken; ``busy_s`` is the PE's busy
    clock (the operators' counted time), which input shares are measured on.
    """

    def __init__(self, inbox: Inbox, outs: list, credits: int, time_slice_s: float,
                 busy_s: Callable[[], float], park: Callable[..., bool], handle: Callable[..., None],
                 broker_sources: bool = False) -> None:
        self.inbox, self.outs, self.credits, self.time_slice_s = inbox, outs, credits, time_slice_s
        self.whole_s = thread_after(time_slice_s)   # a batch this long is taken whole (slice_size)
        self.busy_s, self.park, self.handle = busy_s, park, handle
        self.broker_sources = broker_sources       # a source here whose backlog waits at a broker
        self.chain: Any = None                     # set once the PE built its chain
        self.full: frozenset[str] = frozenset()    # producers of full output channels
        self.backed: frozenset[str] = frozenset()  # producers of out-of-credit channels a broker source must not feed
        self.parked: frozenset[str] = frozenset()  # producers of held channels with a full channel's backlog
        self.spent: dict[int, float] = {}          # id(input channel) -> busy time its batches took
        self._feeds: dict[tuple[str, str], bool] = {}   # input -> feeds a full channel, for self.full
        self._backs: dict[tuple[str, str], bool] = {}   # source -> feeds a backed channel
        self._parks: dict[tuple[str, str], bool] = {}   # source -> feeds a parked channel
        self._outputs_open = False                 # every output channel opened once (opening())
        self._waking: set[int] = set()             # ids of openings that wake the PE when they end
        # gated instances (pending_groups.py) holding more than a credit window: held as full
        self.holds: Callable[[], frozenset[str]] = frozenset

    def take(self) -> bool:
        """Take inbox items until it is empty or the time slice is used up (hot loop, hence long).

        Inputs share the PE's time fairly (start-time fair queueing): a data
        batch waits while another channel that has spent less of the PE's busy
        time on its batches has one to take. In arrival order, a cheap input
        (a copy's output into the sink fused with its original) queued behind
        the credit window of an expensive one (the original's own input: a
        second of CPU on a starved host) and held the copy back by credit
        (issue 15); turns of one batch each still gave each copy one batch per
        expensive one. Each channel stays FIFO: once one of its items waits,
        the rest of its items wait behind it.

        A data batch that would run past the turn's deadline is taken in part
        (``handle`` gets the deadline; :func:`slice_size` says how much): its
        rest goes back in front as a :class:`~.channels.Rest` and the turn ends,
        so the PE's outputs ship and its control calls run between slices. A
        batch of 1,000 changes into a disk store holding 10^7 keys took 30-60 ms:
        that long, nothing else the PE emits went out (issue 30's stall).
        """
        items = self.inbox.items
        if not items:
            return False
        deadline = perf_counter() + self.time_slice_s
        deferred: list = []             # items that wait for a later turn, in order
        waiting: set[int] = set()       # ids of channels with an item in ``deferred``
        yielded: set[int] = set()       # those of them that wait for their turn (not for credit)
        spent = self._share_start(items)
        taken = False
        while items:
            item = channel, kind, payload = items.popleft()
            # Parked before deferred: a channel blocked at a barrier keeps its items in one place,
            # in order, until the snapshot hands them back in front of the inbox (barriers.py).
            if self.park(channel, kind, payload):
                taken = True
                continue                        # blocked at the marker until aligned
            if id(channel) in waiting or not channel.wired or (self.full and self.feeds_full(channel.src_op, channel.port)):
                deferred.append(item)           # feeds a full channel, has no edge yet, or behind its own
                waiting.add(id(channel))
                continue
            if kind == DATA and len(spent) > 1 and not self._turn(channel, items, yielded, spent):
                deferred.append(item)           # one that spent less has a batch: its turn first
                waiting.add(id(channel))
                yielded.add(id(channel))
                continue
            taken = True
            if kind == DATA:
                t0, n0 = self.busy_s(), channel.tuples
                rest = self.handle(channel, kind, payload, deadline, self.whole_s)
                took = self.busy_s() - t0
                spent[id(channel)] = spent.get(id(channel), 0.0) + took
                if channel.tuples > n0:
                    channel.tuple_s = took / (channel.tuples - n0)
                if rest is not None:            # the batch's tuples past the deadline: the next turn's
                    items.appendleft((channel, kind, rest))
                    break
            else:
                self.handle(channel, kind, payload)
            if perf_counter() >= deadline:
                break
        if deferred:
            items.extendleft(reversed(deferred))   # back in front: each channel stays FIFO
        return taken

    def _share_start(self, items) -> dict[int, float]:
        """Busy time spent per input channel with items queued now, counted from the least-served
        one: a channel that had none starts level with it (an idle spell banks no time)."""
        queued = {id(c) for c, _kind, _payload in list(items) if c.wired}   # a copy: the event loop appends
        spent = {c: t for c, t in self.spent.items() if c in queued}
        floor = min(spent.values(), default=0.0)
        self.spent = {c: spent.get(c, floor) - floor for c in queued}
        return self.spent

    def _turn(self, channel: ChannelIn, items, yielded: set[int], spent: dict[int, float]) -> bool:
        """Is it ``channel``'s turn for a data batch? Not while a channel that spent less waits
        for its turn in this pass, or has an item further on that may be taken. The channel that
        spent least among those with batches always may: a pass that has batches takes one (a
        pass that took nothing would spin the PE loop without yielding). A channel that waits for
        its edge (``ChannelIn.wired``) has no turn: its batches cannot be taken yet."""
        mine = spent.get(id(channel), 0.0)
        if any(spent.get(c, 0.0) < mine for c in yielded):
            return False
        return not any(c is not channel and c.wired and spent.get(id(c), 0.0) < mine
                       and (id(c) in yielded or not (self.full and self.feeds_full(c.src_op, c.port)))
                       for c, _kind, _payload in list(items))

    def feeds_full(self, op_id: str, port: str = "out") -> bool:
        """Would taking this input (a channel's producer and port, or a source here) emit into a
        full output channel?"""
        return self._feeds_into(self.full, self._feeds, op_id, port)

    def _feeds_into(self, producers: frozenset[str], cache: dict, op_id: str, port: str = "out") -> bool:
        """Would taking input ``(op_id, port)`` emit into an output channel of one of ``producers``?
        Cached in ``cache`` until that set or the chain's edges change."""
        if not producers:
            return False
        hit = cache.get((op_id, port))
        if hit is None:
            hit = cache[(op_id, port)] = feeds(self.chain.edges, self.chain.nodes, op_id, port, producers)
        return hit

    def edges_changed(self) -> None:
        """The chain's inputs changed (a rewire): what feeds a full, backed or parked channel is
        found again."""
        self._feeds, self._backs, self._parks = {}, {}, {}

    def source_held(self, driver: Any) -> bool:
        """Would reading ``driver``'s source emit into a full output channel, or, for a source
        whose backlog waits at a broker (``backlog_elsewhere``: Kafka, Redis Streams), into one
        out of credit with ``SOURCE_BACKLOG`` batches buffered? Then it waits: what it has not read
        stays where any copy of what follows can take it, instead of lining up in a channel to
        one instance (bench/kafka.py (e)). No sender waits on a source, so this stricter rule
        keeps the argument above. Other sources read ahead as channel input does: a generator
        that stops at one batch lost a third of bench/parallel.py's copy speed-up. At PE start
        every source waits until the output channels are open (:meth:`opening`). Every source
        waits while it would feed a held channel with a full channel's backlog (``parked``, the
        module doc): until the rewire, what it reads could go nowhere else."""
        return self.opening() or self.feeds_full(driver.op_id) or (
            getattr(driver.source, "backlog_elsewhere", False)
            and self._feeds_into(self.backed, self._backs, driver.op_id)) or (
            self._feeds_into(self.parked, self._parks, driver.op_id))

    def opening(self) -> bool:
        """Is an output channel of the PE still being opened (at its start)? Its sources wait
        meanwhile: a source that read at once had its first tuples wait in the channel for the
        connection (handshake, or the receiving PE still being built), and they came out as a
        burst behind it (issue 34's p99 at 50 % of capacity). The wait is bounded by the opening's
        own (``handshake.HANDSHAKE_TIMEOUT_S``); an opening that failed fails the PE with why.
        The PE is woken when each opening ends (its credit, ``ChannelOut.open_in_background``,
        or here when it fails). Once all were open this is one attribute read per source a turn."""
        if self._outputs_open:
            return False
        pending = [channel for _spec, channel in self.outs
                   if channel.opening is not None and not channel.opening.cancelled()]   # cancelled: closed
        for channel in pending:
            opening = channel.opening
            if opening.done() and opening.exception() is not None:
                raise RuntimeError(f"the sources of this PE wait for output channel {channel.channel_id!r}, "
                                   f"which could not open: {opening.exception()}") from opening.exception()
            if id(opening) not in self._waking:
                self._waking.add(id(opening))
                opening.add_done_callback(lambda _f: self.inbox.event.set())   # a failure gives no credit
        if pending:
            return True
        self._outputs_open = True
        return False

    async def flush(self) -> bool:
        """Ship what credit allows, never waiting for it, and note which channels are full;
        True when a channel stopped being full: the input it held back may be taken now (a
        source skipped in this turn for it has no inbox item to wake the PE, and waiting a
        source poll instead idled a source that was behind for half its time).

        A channel out of credit with ``RELIEF_BATCHES`` credit windows buffered
        is full: until it has credit again the PE takes no input that feeds it,
        and takes all other input (waiting instead deadlocked PEs that feed
        each other). A channel to an instance of a STATELESS operator is
        spared while another instance takes batches: its router sends them
        there (plan/routing.py). When nothing is left to take while a full
        channel holds input back, the PE's idle wait is for its credit, and
        that wait is the backpressure the monitor counts.

        A gated instance holding more than a credit window of tuples for key
        groups still on their way (``holds``, pending_groups.py) is held the
        same way: no input that reaches it is taken until its groups arrive
        (their import wakes the PE). Its senders wait for credit meanwhile. No
        deadlock: the groups' arrival waits only on PEs downstream of their old
        owner taking its marker, already sent, and none of them waits on this
        instance (the copy of a MERGEABLE operator feeds its original's PE,
        which is not waited on: ``plan_reconfiguration``'s ``ordered``).
        """
        out_of_credit = [(spec, channel) for spec, channel in self.outs
                         if channel.pending and not await channel.flush(wait=False)]
        freed, full = self._gated(out_of_credit, RELIEF_BATCHES * self.credits, self.full, self.holds())
        if full != self.full:
            self.full, self._feeds = full, {}
        if self.broker_sources:
            held_free, backed = self._gated(out_of_credit, SOURCE_BACKLOG, self.backed)
            freed = freed or held_free      # a held source has no inbox item to wake it
            if backed != self.backed:
                self.backed, self._backs = backed, {}
        parked = frozenset(spec.src_op for spec, channel in self.outs
                           if channel.held and channel.data_pending() >= RELIEF_BATCHES * self.credits)
        if parked != self.parked:
            freed = freed or bool(self.parked - parked)     # a parked source has no inbox item to wake it
            self.parked, self._parks = parked, {}
        return freed

    def _gated(self, out_of_credit: list, backlog: int, before: frozenset[str],
               held: frozenset[str] = frozenset()) -> tuple[bool, frozenset[str]]:
        """The producers whose channel is out of credit with ``backlog`` batches buffered (and not
        spared by a router), with ``held`` (operators that take no more input for now), and
        whether one of ``before`` left that set."""
        full_ = partial(ChannelOut.full, backlog=backlog)
        now = held | frozenset(spec.src_op for spec, channel in out_of_credit
                               if full_(channel) and not self.chain.spared(channel, full_))
        return bool(before - now), now

    def ready(self) -> bool:
        """Work that needs no waiting: input this PE may take, or output credit lets it ship."""
        if any(c.wired and not self.feeds_full(c.src_op, c.port) for c, _kind, _payload in self.inbox.items):
            return True
        return any(not ch.held and ch.can_ship() for _s, ch in self.outs)

    async def idle(self, due: Callable[[], list[float]], waiting: Callable[[Any], ContextManager]) -> None:
        """Nothing to do: wait for input or credit, or until the first of ``due()`` (seconds until
        a paced or empty source is due, or a lingering channel ships) has passed. ``waiting(gate)``
        counts the wait: backpressure on ``gate`` (:meth:`holding_back`), else idle time
        (pe_figures.py).

        Output that appeared while the last flush awaited (a reconfiguration
        marker from ``hold``, an aligned operator's marker) is not waited on:
        its wake-up may have come before the ``clear`` below, and a marker that
        stays unsent can stall a whole reconfiguration.
        """
        event = self.inbox.event
        event.clear()
        if self.ready():
            return
        waits = due()
        with waiting(self.holding_back()):
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel
                # that lands as the event fires, and the PE would outlive pe_stop.
                # The event is set by input, by credit (gate.wake) and by control calls.
                async with asyncio.timeout(min(waits) if waits else None):
                    await event.wait()
            except TimeoutError:
                pass

    def holding_back(self) -> Any:
        """The gate of a full output channel while the flow holds input back for it, else None:
        that wait, and only that one, is backpressure. (A paced source waiting for its schedule
        while one routed channel waits for credit and another instance has room is idle, issue 15.)"""
        held = self.full | self.backed      # backed: a broker source waits (source_held)
        if not held:
            return None
        return next((ch.gate for spec, ch in self.outs
                     if spec.src_op in held and ch.pending and not ch.held), None)

    def shipped_toward(self, receivers: dict[str, ChannelIn], channel_ids: list[str]) -> int:
        """Batches shipped on the full output channels these input channels feed: the backlog a
        marker on them waits behind (a drain that only ships still moves, ``PEHost.pe_reconf_wait``)."""
        if not self.full or self.chain is None:
            return 0
        edges = self.chain.edges
        start = [d for c in channel_ids if (r := receivers.get(c)) is not None
                 for s, port, d in edges if (s, port) == (r.src_op, r.port)]
        reach = downstream(edges, start) & self.full
        return sum(ch.batches for spec, ch in list(self.outs) if spec.src_op in reach)

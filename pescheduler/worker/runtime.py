"""A processing element at run time: its chain, inputs, outputs and loop.

Where a PE runs, and why: on the worker's event loop, yielding after every
batch (turns.py has the measurements and when a PE moves to a thread). The
loop bounds how long it holds the event loop (``pescheduler.pe.time-slice-ms``)
so heartbeats keep flowing. Its parts live beside it: the source pump
(source_driver.py), marker alignment (aligner.py), turns (turns.py), and the
wire specs it is built from (pescheduler/wire.py).
"""

from __future__ import annotations

import asyncio
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from time import perf_counter
from typing import Any, Callable, Iterable

from . import flow
from .chain import MIN_WATERMARK, Chain
from .channels import (DATA, ENCODED, END, MALFORMED, MARKER, WATERMARK, ChannelIn, ChannelOut, Inbox,
                       LocalChannelOut, TcpChannelOut, decode)
from ..operator import DeadLetter, OperatorContext, Source
from .aligner import Aligner
from .barriers import Barriers, is_barrier
from .source_driver import SourceDriver, pump
from ..wire import InputSpec, OutputSpec, PESpec
from .turns import Turns

SOURCE_POLL_S = 0.05     # how often a source that had nothing ready is asked again
RELIEF_BATCHES = 2       # backlog (in credit windows) that makes an out-of-credit channel full (flow.py)
SOURCE_BACKLOG = 1       # batches buffered on an out-of-credit channel that stop a broker source feeding it


class PERunner:
    """Runs one PE: reads sources and channels, pushes batches through the chain, ships outputs."""

    def __init__(self, spec: PESpec, worker_address: str, on_change: Callable[[], None] = lambda: None,
                 spare_thread: ThreadPoolExecutor | None = None) -> None:
        self.spec = spec
        self.pe_id = spec.pe_id
        self.deployment = spec.deployment
        self.worker_address = worker_address
        self.ops = {op_id: cls(**params) for op_id, (cls, params, _key) in spec.ops.items()}
        for op_id, saved in spec.restore.items():
            self.ops[op_id].restore(saved["state"])       # before open(): a restored op continues
            if saved.get("position") is not None:         # a checkpoint's durable source position
                self.ops[op_id].seek(saved["position"])
        self.inbox = Inbox()
        self.receivers = {i.channel_id: ChannelIn(i.channel_id, i.src_op, i.port) for i in spec.inputs}
        self.outs: list[tuple[OutputSpec, ChannelOut]] = []
        self.chain: Chain | None = None
        self.sources = [SourceDriver(op_id, op, spec.batch_size)
                        for op_id, op in self.ops.items() if isinstance(op, Source)]
        # a source whose backlog waits at a broker reads no further than SOURCE_BACKLOG (_flush)
        self._broker_sources = any(getattr(d.source, "backlog_elsewhere", False) for d in self.sources)
        for driver in self.sources:
            if driver.op_id in spec.restore:
                driver.restore(spec.restore[driver.op_id]["driver"])
        self.stopping = False                      # set by stop(): the loop ends at its next turn
        self.turns = Turns(spec.pe_id, spec.time_slice_s, spare_thread,   # on the loop or in a thread
                           clock=self._busy_s)
        self.aligner = Aligner()                   # markers seen, alignment (see aligner.py)
        self.barriers = Barriers(self)             # checkpoints (see barriers.py)
        self.on_change = on_change                 # the PE host's: a PE changed state
        self.credentials = None                    # set by the PE host: deployment secret, TLS (handshake.py)
        self.checkpointing = False                 # set by the PE host: the deployment takes checkpoints
        self.state = "created"
        self.error: str | None = None
        self.idle_s = 0.0
        self._idle_since: float | None = None      # when the current idle wait began
        self.started_at = 0.0
        self.first_input_at: float | None = None   # wall clock of the first batch in (copy activation)
        self.side_counts: dict[str, int] = {}
        self.task: asyncio.Task | None = None
        self.full: frozenset[str] = frozenset()     # producers of full output channels (flow.py)
        self._feeds: dict[tuple[str, str], bool] = {}   # input -> feeds a full channel, for self.full
        self.backed: frozenset[str] = frozenset()   # producers of out-of-credit channels a source must not feed
        self._backs: dict[tuple[str, str], bool] = {}   # source -> feeds such a channel, for self.backed
        self._spent: dict[int, float] = {}         # id(input channel) -> busy time its batches took (_read_inbox)

    # -- wiring ---------------------------------------------------------------------
    async def connect(self, local_receivers: Callable[[str], tuple[Inbox, ChannelIn]],
                      data_address: str) -> None:
        """Open the outgoing channels (in memory when the receiver is on this worker)."""
        self.open_outputs(local_receivers, data_address)
        await self.opened()

    def open_outputs(self, local_receivers: Callable[[str], tuple[Inbox, ChannelIn]], data_address: str,
                     expect: Callable[[str], Any] | None = None) -> None:
        """Begin opening the outgoing channels and build the chain: the PE may start before they
        are open (their data waits, ChannelOut.open_in_background). ``expect``: how to wait for
        a receiver on this worker that is not there yet (without it, a KeyError)."""
        outputs: dict[tuple[str, str], list[ChannelOut]] = {}
        for out in self.spec.outputs:
            channel = self._open_channel(out, local_receivers, data_address, expect)
            self.outs.append((out, channel))
            outputs.setdefault((out.src_op, out.port), []).append(channel)
        self.chain = Chain(self.ops, self.spec.edges, outputs, on_side=self._side,
                           routing=self.spec.routing, copies=self.spec.copies)
        progress = {op: saved["progress"] for op, saved in self.spec.restore.items()}
        if progress:
            self.chain.restore_progress(progress)

    async def opened(self) -> None:
        """Return once every output channel is open; raise why one could not open."""
        await asyncio.gather(*(channel.opened() for _spec, channel in self.outs))

    def _open_channel(self, out: OutputSpec, local_receivers, data_address: str, expect=None) -> ChannelOut:
        if out.dst_data == data_address:
            channel = LocalChannelOut(out.channel_id, self.spec.credits, linger_s=self.spec.linger_s,
                                      batch_size=self.spec.batch_size)
            try:
                channel.attach(*local_receivers(out.channel_id))
            except KeyError:
                if expect is None:
                    raise
                channel.attach_later(expect)
        else:
            channel = TcpChannelOut(out.channel_id, self.spec.credits,
                                    lambda item, exc, op=out.src_op: self._dead(item, exc, op),
                                    linger_s=self.spec.linger_s, batch_size=self.spec.batch_size)
            channel.open(out.dst_data, self.credentials)
        channel.dst_ops = out.dst_ops          # routers pick channels by the instance they reach
        channel.gate.wake = self.inbox.event.set     # credit wakes an idle PE (see _idle)
        return channel

    def _dead(self, item: Any, exc: BaseException | str, op_id: str) -> None:
        self.chain.dead_letters.append(DeadLetter.of(item, exc, op_id))

    def _side(self, op_id: str, port: str, items: list) -> None:
        """A side output nobody consumes (e.g. late events): counted, kept for the controller."""
        key = f"{op_id}.{port}"
        self.side_counts[key] = self.side_counts.get(key, 0) + len(items)

    # -- the loop -------------------------------------------------------------------
    def start(self) -> asyncio.Task:
        self.turns.bind()
        self.state = "running"
        self.task = asyncio.create_task(self.run(), name=f"pe {self.pe_id}")
        return self.task

    async def run(self) -> None:
        self.started_at = perf_counter()
        try:
            for op_id, op in self.ops.items():
                _cls, _params, key_field = self.spec.ops[op_id]
                inputs = [src for src, _port, dst in self.spec.edges if dst == op_id]
                op.open(OperatorContext(op_id=op_id, pe_id=self.pe_id, worker=self.worker_address,
                                        key_field=key_field,
                                        extra={"inputs": inputs, "checkpoint": self.checkpointing}))
            self.barriers.restored(self.spec.restore)     # sinks restored from a checkpoint settle it
            # A PE whose chain ended while a reconfiguration holds its outputs stays until the
            # rewire: the held data and the end it held back (Chain.freeze) still have to go out on
            # the new channels, and only this loop ships them (issue 16: a fast columnar source
            # ended during the pause of a Replicate, and the window's new PE waited forever).
            while not (self.chain.finished and not self.chain.frozen) and not self.stopping:
                progressed = await self.turns.run(self._work)
                if await self._flush() or progressed:    # input held back for a full channel may go now
                    await asyncio.sleep(0)          # let the worker answer its calls
                else:
                    await self._idle()
            if self.stopping:
                raise asyncio.CancelledError
            for _spec, channel in self.outs:   # every input ended: nothing left to defer (flow.py)
                await channel.flush()
            self.state = "finished"
        except asyncio.CancelledError:
            self.state = "stopped"
            raise
        except Exception:
            self.state = "failed"
            self.error = f"PE {self.pe_id} on {self.worker_address} failed:\n{traceback.format_exc()}"
        finally:
            self.turns.close()                  # never close operators under a running turn
            self.chain.close()
            for _spec, channel in self.outs:
                await channel.close()

    def _work(self) -> bool:
        return self._read_sources() | self._read_inbox()

    def _read_sources(self) -> bool:
        progressed = False
        for driver in self.sources:
            if driver.ended or driver.paused or driver.delay() > 0 or self._source_held(driver):
                continue
            if pump(driver, self.chain) != 0:      # a batch, or the end
                progressed = True
        return progressed

    def _read_inbox(self) -> bool:
        """Take inbox items until it is empty or the time slice is used up.

        Inputs share the PE's time fairly (start-time fair queueing): a data
        batch waits while another channel that has spent less of the PE's busy
        time on its batches has one to take. In arrival order, a cheap input
        (a copy's output into the sink fused with its original) queued behind
        the credit window of an expensive one (the original's own input: a
        second of CPU on a starved host) and held the copy back by credit
        (issue 15); turns of one batch each still gave each copy one batch per
        expensive one. Each channel stays FIFO: once one of its items waits,
        the rest of its items wait behind it.
        """
        items = self.inbox.items
        if not items:
            return False
        chain, aligner = self.chain, self.aligner
        deadline = perf_counter() + self.spec.time_slice_s
        deferred: list = []             # items that wait for a later turn, in order
        waiting: set[int] = set()       # ids of channels with an item in ``deferred``
        yielded: set[int] = set()       # those of them that wait for their turn (not for credit)
        spent = self._share_start(items)
        taken = False
        while items:
            item = channel, kind, payload = items.popleft()
            # Parked before deferred: a channel blocked at a barrier keeps its items in one place,
            # in order, until the snapshot hands them back in front of the inbox (barriers.py).
            if aligner.marker is not None and aligner.park(channel, kind, payload):
                taken = True
                continue                        # blocked at the marker until aligned
            if id(channel) in waiting or (self.full and self._feeds_full(channel.src_op, channel.port)):
                deferred.append(item)           # feeds a full channel (flow.py), or behind its own
                waiting.add(id(channel))
                continue
            if kind == DATA and len(spent) > 1 and not self._turn(channel, items, yielded, spent):
                deferred.append(item)           # one that spent less has a batch: its turn first
                waiting.add(id(channel))
                yielded.add(id(channel))
                continue
            taken = True
            if kind == DATA:
                if self.first_input_at is None:
                    self.first_input_at = time.time()
                self.inbox.data_batches -= 1
                try:
                    batch = decode(payload) if isinstance(payload, ENCODED) else payload
                except Exception as exc:        # a proven peer's unreadable batch: a dead letter, not a failure
                    self.turns.on_loop(channel.grant)
                    self._dead(bytes(payload[:256]), exc, f"channel {channel.channel_id}")
                    continue
                self.turns.on_loop(channel.grant)    # per batch, so the sender keeps pipelining
                channel.tuples += len(batch)
                t0 = self._busy_s()
                chain.emit_from(channel.src_op, batch, channel.port)
                spent[id(channel)] = spent.get(id(channel), 0.0) + self._busy_s() - t0
            elif kind == WATERMARK:
                chain.watermark_from(channel.src_op, payload)
            elif kind == END:
                chain.end_from(channel.src_op)
                channel.ended = True
                self.check_aligned()
            elif kind == MARKER:
                self._on_marker(channel, payload)
            elif kind == MALFORMED:         # a control frame that could not be read (channels.py)
                self._dead(*payload, f"channel {channel.channel_id}")
            if perf_counter() >= deadline:
                break
        if deferred:
            items.extendleft(reversed(deferred))   # back in front: each channel stays FIFO
        return taken

    def _busy_s(self) -> float:
        """Busy time the operators have counted so far (on busy_clock, by the chain and the source
        pump): what turns and input shares are timed on, without reading the clock again (a
        system call, about 3 us: 7% of both workers' samples at 1.6 tuples a batch, issue 15)."""
        chain = self.chain
        return sum(node.stats.busy_s for node in chain.nodes.values()) if chain is not None else 0.0

    def _share_start(self, items) -> dict[int, float]:
        """Busy time spent per input channel with items queued now (``_read_inbox``), counted
        from the least-served one: a channel that had none starts level with it (an idle spell
        banks no time)."""
        queued = {id(c) for c, _kind, _payload in list(items)}   # a copy: the event loop appends
        spent = {c: t for c, t in self._spent.items() if c in queued}
        floor = min(spent.values(), default=0.0)
        self._spent = {c: spent.get(c, floor) - floor for c in queued}
        return self._spent

    def _turn(self, channel: ChannelIn, items, yielded: set[int], spent: dict[int, float]) -> bool:
        """Is it ``channel``'s turn for a data batch? Not while a channel that spent less waits
        for its turn in this pass, or has an item further on that may be taken. The channel that
        spent least among those with batches always may: a pass that has batches takes one (a
        pass that took nothing would spin the PE loop without yielding)."""
        mine = spent.get(id(channel), 0.0)
        if any(spent.get(c, 0.0) < mine for c in yielded):
            return False
        return not any(c is not channel and spent.get(id(c), 0.0) < mine
                       and (id(c) in yielded or not (self.full and self._feeds_full(c.src_op, c.port)))
                       for c, _kind, _payload in list(items))

    def _feeds_full(self, op_id: str, port: str = "out") -> bool:
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
            hit = cache[(op_id, port)] = flow.feeds(self.chain.edges, self.chain.nodes, op_id, port, producers)
        return hit

    def _source_held(self, driver: SourceDriver) -> bool:
        """Would reading ``driver``'s source emit into a full output channel, or, for a source
        whose backlog waits at a broker (``backlog_elsewhere``: Kafka, Redis Streams), into one
        out of credit with ``SOURCE_BACKLOG`` batches buffered? Then it waits: what it has not read
        stays where any copy of what follows can take it, instead of lining up in a channel to
        one instance (bench/kafka.py (e)). No sender waits on a source, so this stricter rule
        keeps flow.py's argument. Other sources read ahead as channel input does: a generator
        that stops at one batch lost a third of bench/parallel.py's copy speed-up."""
        return self._feeds_full(driver.op_id) or (
            getattr(driver.source, "backlog_elsewhere", False)
            and self._feeds_into(self.backed, self._backs, driver.op_id))

    async def _flush(self) -> bool:
        """Ship what credit allows, never waiting for it, and note which channels are full;
        True when a channel stopped being full: the input it held back may be taken now (a
        source skipped in this turn for it has no inbox item to wake the PE, and waiting a
        source poll instead idled a source that was behind for half its time).

        A channel out of credit with ``RELIEF_BATCHES`` credit windows buffered
        is full: until it has credit again the PE takes no input that feeds it,
        and takes all other input (flow.py: waiting instead deadlocked PEs that
        feed each other). A channel to an instance of a STATELESS operator is
        spared while another instance takes batches: its router sends them
        there (plan/routing.py). When nothing is left to take while a full
        channel holds input back, ``_idle`` waits for its credit, and that wait
        is the backpressure the monitor counts.
        """
        out_of_credit = [(spec, channel) for spec, channel in self.outs
                         if channel.pending and not await channel.flush(wait=False)]
        full_ = partial(ChannelOut.full, backlog=RELIEF_BATCHES * self.spec.credits)
        full = {spec.src_op for spec, channel in out_of_credit
                if full_(channel) and not self.chain.spared(channel, full_)}
        freed = bool(self.full - full)
        if full != self.full:
            self.full, self._feeds = frozenset(full), {}
        if self._broker_sources:
            backed_ = partial(ChannelOut.full, backlog=SOURCE_BACKLOG)
            backed = {spec.src_op for spec, channel in out_of_credit
                      if backed_(channel) and not self.chain.spared(channel, backed_)}
            freed = freed or bool(self.backed - backed)      # a held source has no inbox item to wake it
            if backed != self.backed:
                self.backed, self._backs = frozenset(backed), {}
        return freed

    def _ready(self) -> bool:
        """Work that needs no waiting: input this PE may take, or output credit lets it ship."""
        if any(not self._feeds_full(c.src_op, c.port) for c, _kind, _payload in self.inbox.items):
            return True
        return any(not ch.held and ch.can_ship() for _s, ch in self.outs)

    def _holding_back(self):
        """The gate of a full output channel (flow.py) while the flow holds input back for it,
        else None: that wait, and only that one, is backpressure."""
        held = self.full | self.backed      # backed: a broker source waits (_source_held)
        if not held:
            return None
        return next((ch.gate for spec, ch in self.outs
                     if spec.src_op in held and ch.pending and not ch.held), None)

    async def _idle(self) -> None:
        """Nothing to do: wait for input, or until a paced or empty source is due.

        Output that appeared while the last flush awaited (a reconfiguration
        marker from ``hold``, an aligned operator's marker) is not waited on:
        its wake-up may have come before the ``clear`` below, and a marker that
        stays unsent can stall a whole reconfiguration.
        """
        self.inbox.event.clear()
        if self._ready():
            return
        waits = [d.delay() or getattr(d.source, "poll_interval", None) or SOURCE_POLL_S for d in self.sources
                 if not (d.ended or d.paused or self._source_held(d))]
        waits += [left for _s, ch in self.outs if not ch.held and (left := ch.linger_left())]
        # The wait is backpressure (on a full channel's gate), not idle time, only while the flow
        # holds input back for a full channel: a paced source waiting for its schedule while one
        # routed channel waits for credit and another instance has room is idle (issue 15).
        blocked = self._holding_back()
        if blocked is None:
            t0 = self._idle_since = perf_counter()
        else:
            blocked.begin_wait()
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel
            # that lands as the event fires, and the PE would outlive pe_stop.
            # The event is set by input, by credit (gate.wake) and by control calls.
            async with asyncio.timeout(min(waits) if waits else None):
                await self.inbox.event.wait()
        except TimeoutError:
            pass
        finally:
            if blocked is None:
                self.idle_s += perf_counter() - t0
                self._idle_since = None
            else:
                blocked.end_wait()

    # -- reconfiguration (see control/protocol.py for the protocol) ------------------------------
    def _on_marker(self, channel: ChannelIn, marker: Any) -> None:
        """A marker arrived behind all data before it on ``channel``: note it, maybe align."""
        if is_barrier(marker):
            if self.barriers.arrived(channel, marker):
                self.check_aligned()
            return
        self.aligner.arrived(channel.channel_id, marker)
        self.check_aligned()
        self.turns.on_loop(self.on_change)

    def begin_align(self, marker: Any, release: bool = False) -> None:
        """Pause this PE's sources and align its operators on ``marker`` (see aligner.py).

        ``release``: the PE is a copy going away; once aligned, a MERGEABLE
        copy sends every partial it holds to its original, ahead of the marker.
        """
        for driver in self.sources:
            driver.pause()
        self.aligner.begin(marker, lambda op_id: self._op_aligned(op_id, marker, release))
        self.check_aligned()

    def check_aligned(self) -> None:
        if self.aligner.advance(self.chain, self.receivers.values()):
            if self.barriers.current is not None:
                self.barriers.aligned()          # snapshot taken, parked input back, sources on
            self.turns.on_loop(self.on_change)

    def _op_aligned(self, op_id: str, marker: Any, release: bool) -> None:
        """``op_id`` aligned: its output channels carry the marker on, then hold."""
        if release and self.chain.nodes[op_id].partial:
            self.chain.release_partials()
        for spec, channel in self.outs:
            if spec.src_op == op_id:
                channel.hold(marker)
        # Wake the loop so the marker ships now: another PE may need it
        # before it can send what this PE's other operators wait for.
        self.turns.on_loop(self.inbox.event.set)

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

    def snapshot(self) -> dict[str, dict]:
        """State, progress and source position of every operator (the PE is aligned and still)."""
        progress = self.chain.progress()
        drivers = {d.op_id: d.snapshot() for d in self.sources}
        return {op_id: {"state": op.snapshot(), "progress": progress[op_id], "driver": drivers.get(op_id)}
                for op_id, op in self.ops.items()}

    async def rewire(self, outputs: list[OutputSpec], remove: list[str], local_receivers,
                     data_address: str, routing: dict | None = None,
                     copies: dict[str, str] | None = None, expect=None) -> None:
        """Replace held output channels by new ones and install new routers; what the old
        channels held goes on along the new routes.

        New channels begin to open first, and the PE does not wait for them
        (their data waits in them until open: :meth:`opened` is awaited by the
        caller, outside the PE's turn). From taking the held items to switching
        the routes there is no ``await``: the PE loop must not emit into a
        channel that is being replaced, or what it emits would be lost. Held
        data is re-sent through the new route to the operator the old channel
        served (its router when that operator has copies), so a batch held for
        a released copy reaches the instances that remain, and a batch held
        for a KEYED operator is split by the new key-group owners.
        """
        opened = [(out, self._open_channel(out, local_receivers, data_address, expect)) for out in outputs]
        olds: list[tuple[OutputSpec, ChannelOut]] = [(spec, ch) for spec, ch in self.outs if ch.channel_id in remove]
        held = {ch.channel_id: ch.take_held() for _spec, ch in olds}
        served = {ch.channel_id: list(dict.fromkeys(self.chain.logical(d) for d in ch.dst_ops)) for _s, ch in olds}
        self.outs = [(spec, ch) for spec, ch in self.outs if ch.channel_id not in remove] + opened
        self.chain.rewire([ch for _s, ch in olds], [(out.src_op, out.port, ch) for out, ch in opened],
                          routing, copies)
        sent: dict[Any, set[int]] = {}         # target -> ids of batches replayed to it
        ended: set[str] = set()
        for spec, old in olds:
            news = [ch for out, ch in opened if (out.src_op, out.port) == (spec.src_op, spec.port)]
            targets = list(dict.fromkeys(call for x in served[old.channel_id]
                                         for call in self.chain.consumer_routes.get((spec.src_op, spec.port, x), ())))
            items = held[old.channel_id]
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
                    for channel in news:
                        if channel.channel_id not in ended:
                            ended.add(channel.channel_id)
                            channel.end()
                else:
                    for channel in news:
                        _replay(channel, kind, payload)
            if old.ended and all(kind != END for kind, _ in items):
                for channel in news:           # END went out before the hold: the new path needs it too
                    if channel.channel_id not in ended:
                        ended.add(channel.channel_id)
                        channel.end()
        self.chain.thaw()                      # watermarks held back since the hold: behind the data
        self.inbox.event.set()
        for _spec, old in olds:
            await old.close(timeout=0)

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
            self.spec = replace(self.spec, edges=edges)
            self.chain.set_edges(edges, initial_wm=MIN_WATERMARK)
        self._feeds = {}

    def stop(self) -> None:
        """End the loop at its next turn (and cancel it: either alone would do, both are sure)."""
        self.stopping = True
        self.inbox.event.set()
        if self.task is not None:
            self.task.cancel()

    def drain(self) -> bool:
        """End this PE's sources at the next loop turn (a graceful stop); False if it has none."""
        live = [d for d in self.sources if not d.ended]
        for driver in live:
            driver.drain()
        self.inbox.event.set()
        return bool(live)

    # -- monitoring -----------------------------------------------------------------
    def stats(self) -> dict:
        """Cumulative counters; the controller turns differences into rates and fractions."""
        ops = {}
        for op_id, node in (self.chain.nodes.items() if self.chain else ()):
            s = node.stats
            ops[op_id] = {"tuples_in": s.tuples_in, "tuples_out": s.tuples_out, "batches_in": s.batches_in,
                          "busy_s": s.busy_s, "dead_letters": s.dead_letters, "side": dict(s.side)}
        for driver in self.sources if self.chain else ():    # deployed, not yet started: no chain
            ops[driver.op_id]["tuples_out"] = driver.count
            if driver.lag is not None and not driver.ended:
                ops[driver.op_id]["lag"] = driver.lag()       # records behind per partition
        marked = list(self.aligner.seen.values())     # a copy: a turn in the PE's thread may add one
        return {
            "pe": self.pe_id, "state": self.state, "error": self.error,
            "elapsed_s": perf_counter() - self.started_at if self.started_at else 0.0,
            "idle_s": self.idle_s + (perf_counter() - self._idle_since if self._idle_since else 0.0),
            "backpressure_s": sum(ch.gate.blocked_s for _s, ch in self.outs),
            "threaded": bool(self.turns.thread), "threaded_because": self.turns.threaded_because,
            "first_input_at": self.first_input_at,
            "routers": self.chain.router_counts() if self.chain else {},
            "queue_batches": self.inbox.data_batches,
            "max_queue_batches": self.inbox.max_data_batches,
            "queue_tuples": self.inbox.queued_tuples(),
            "operators": ops,
            "side": dict(self.side_counts),
            "channels_out": {ch.channel_id: {"tuples": ch.tuples, "batches": ch.batches,
                                             "credits": ch.gate.credits, "pending": len(ch.pending),
                                             "held": ch.held}
                             for _s, ch in self.outs},
            "full": sorted(self.full),              # producers of full output channels (flow.py)
            "aligning": self.aligner.marker is not None and not self.aligner.aligned,
            "channels_in": {c.channel_id: {"tuples": c.tuples, "ended": c.ended,
                                           "marked": any(c.channel_id in seen for seen in marked)}
                            for c in self.receivers.values()},
            "frozen": sorted(self.chain.frozen) if self.chain else [],
        }

    def take_dead_letters(self) -> list[DeadLetter]:
        if self.chain is None or not self.chain.dead_letters:
            return []
        return self.chain.take_dead_letters()


def _replay(channel: ChannelOut, kind: int, payload: Any) -> None:
    """Re-emit one held item on a replacement channel."""
    if kind == DATA:
        channel.send(payload)
    elif kind == WATERMARK:
        channel.watermark(payload)
    elif kind == END:
        channel.end()

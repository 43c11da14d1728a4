"""A processing element at run time: its chain, inputs, outputs and loop.

Where a PE runs, and why: on the worker's event loop, yielding after every
batch (turns.py has the measurements and when a PE moves to a thread). The
loop bounds how long it holds the event loop (``pescheduler.pe.time-slice-ms``)
so heartbeats keep flowing. Its parts live beside it: the source pump
(source_driver.py), marker alignment (aligner.py), turns (turns.py), and the
wire specs it is built from (pescheduler/wire.py), input choice and flow
gating (flow.py's InputScheduler), rewiring (rewirer.py), checkpoints
(barriers.py). The PE host drives it only through its control port: the
methods under "the control port" below, each taken between the PE's turns.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from time import perf_counter
from typing import Any, Callable, Iterable

from ..operator import DeadLetter, OperatorContext, Source
from ..wire import InputSpec, OutputSpec, PESpec
from .aligner import Aligner
from .barriers import Barriers, is_barrier
from .chain import Chain
from .channels import (DATA, ENCODED, END, MALFORMED, MARKER, WATERMARK, ChannelIn, ChannelOut, Inbox,
                       LocalChannelOut, TcpChannelOut, decode)
from .flow import InputScheduler
from .rewirer import Rewirer
from .source_driver import SourceDriver, pump
from .turns import Turns

SOURCE_POLL_S = 0.05     # how often a source that had nothing ready is asked again


class PERunner:
    """Runs one PE: reads sources and channels, pushes batches through the chain, ships outputs."""

    def __init__(self, spec: PESpec, worker_address: str, on_change: Callable[[], None] = lambda: None,
                 spare_thread: ThreadPoolExecutor | None = None) -> None:
        self.spec = spec
        self.pe_id = spec.pe_id
        self.worker_address = worker_address
        self.ops = {op_id: cls(**params) for op_id, (cls, params, _key) in spec.ops.items()}
        for op_id, saved in spec.restore.items():
            self.ops[op_id].restore(saved["state"])       # before open(): a restored op continues
            if saved.get("position") is not None:         # a checkpoint's durable source position
                self.ops[op_id].seek(saved["position"])
        self.inbox = Inbox()
        self.receivers = {i.channel_id: ChannelIn(i.channel_id, i.src_op, i.port) for i in spec.inputs}
        self.outs: list[tuple[OutputSpec, ChannelOut]] = []      # rewired in place (rewirer.py)
        self.chain: Chain | None = None
        self.sources = [SourceDriver(op_id, op, spec.batch_size)
                        for op_id, op in self.ops.items() if isinstance(op, Source)]
        for driver in self.sources:
            if driver.op_id in spec.restore:
                driver.restore(spec.restore[driver.op_id]["driver"])
        self.stopping = False                      # set by stop(): the loop ends at its next turn
        self.turns = Turns(spec.pe_id, spec.time_slice_s, spare_thread,   # on the loop or in a thread
                           clock=self._busy_s)
        waits = [op_id for op_id, op in self.ops.items() if op.may_block]
        if waits:      # never the worker's loop: a delivery retrying for seconds would silence it
            self.turns.go_threaded(f"{waits[0]} may wait on deliveries")
        self.aligner = Aligner()                   # markers seen, alignment (see aligner.py)
        self.barriers = Barriers(self)             # checkpoints (see barriers.py)
        # a source whose backlog waits at a broker reads no further than flow.SOURCE_BACKLOG
        self.inputs = InputScheduler(self.inbox, self.outs, spec.credits, spec.time_slice_s, self._busy_s,
                                     self._parked, self._take, broker_sources=any(
                                         getattr(d.source, "backlog_elsewhere", False) for d in self.sources))
        self.rewirer = Rewirer(self.outs, self.receivers, self.inbox, self.aligner, self.inputs)
        self.on_change = on_change                 # the PE host's: a PE changed state
        self.credentials = None                    # set by the PE host: deployment secret, TLS (handshake.py)
        self.checkpointing = False                 # set by the PE host: the deployment takes checkpoints
        self.state_backend = "memory"              # set by the PE host: the deployment's keyed-state backend
        self.state = "created"
        self.error: str | None = None
        self.idle_s = 0.0
        self._idle_since: float | None = None      # when the current idle wait began
        self.started_at = 0.0
        self.first_input_at: float | None = None   # wall clock of the first batch in (copy activation)
        self.side_counts: dict[str, int] = {}
        self.task: asyncio.Task | None = None

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
        self.chain = self.inputs.chain = self.rewirer.chain = Chain(
            self.ops, self.spec.edges, outputs, on_side=self._side, routing=self.spec.routing, copies=self.spec.copies)
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
                                        extra={"inputs": inputs, "checkpoint": self.checkpointing,
                                               "state": self.state_backend, "deployment": self.spec.deployment}))
            async with self.turns.lock:                  # sinks restored from a checkpoint settle it
                await self.turns.off_loop(lambda: self.barriers.restored(self.spec.restore))
            # A PE whose chain ended while a reconfiguration holds its outputs stays until the
            # rewire: the held data and the end it held back (Chain.freeze) still have to go out on
            # the new channels, and only this loop ships them (issue 16: a fast columnar source
            # ended during the pause of a Replicate, and the window's new PE waited forever).
            while not (self.chain.finished and not self.chain.frozen) and not self.stopping:
                progressed = await self.turns.run(self._work)
                if await self.inputs.flush() or progressed:    # input held back for a full channel may go now
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
        self.barriers.check()                   # a sink's commit failed outside the loop: fail here
        return self.read_sources() | self.inputs.take()

    def read_sources(self) -> bool:
        """One batch from every source that is due and not held back (flow.py); True if any moved."""
        progressed = False
        for driver in self.sources:
            if driver.ended or driver.paused or driver.delay() > 0 or self.inputs.source_held(driver):
                continue
            if pump(driver, self.chain) != 0:      # a batch, or the end
                progressed = True
        return progressed

    def _parked(self, channel: ChannelIn, kind: int, payload: Any) -> bool:
        """Kept behind an alignment marker (aligner.py)?"""
        return self.aligner.marker is not None and self.aligner.park(channel, kind, payload)

    def _take(self, channel: ChannelIn, kind: int, payload: Any) -> None:
        """Process one inbox item the scheduler took (flow.InputScheduler.take)."""
        chain = self.chain
        if kind == DATA:
            if self.first_input_at is None:
                self.first_input_at = time.time()
            self.inbox.data_batches -= 1
            try:
                batch = decode(payload) if isinstance(payload, ENCODED) else payload
            except Exception as exc:        # a proven peer's unreadable batch: a dead letter, not a failure
                self.turns.on_loop(channel.grant)
                self._dead(bytes(payload[:256]), exc, f"channel {channel.channel_id}")
                return
            self.turns.on_loop(channel.grant)    # per batch, so the sender keeps pipelining
            channel.tuples += len(batch)
            chain.emit_from(channel.src_op, batch, channel.port)
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

    def _busy_s(self) -> float:
        """Busy time the operators have counted so far (on busy_clock, by the chain and the source
        pump): what turns and input shares are timed on, without reading the clock again (a
        system call, about 3 us: 7% of both workers' samples at 1.6 tuples a batch, issue 15)."""
        chain = self.chain
        return sum(node.stats.busy_s for node in chain.nodes.values()) if chain is not None else 0.0

    async def _idle(self) -> None:
        """Nothing to do: wait for input, or until a paced or empty source is due.

        Output that appeared while the last flush awaited (a reconfiguration
        marker from ``hold``, an aligned operator's marker) is not waited on:
        its wake-up may have come before the ``clear`` below, and a marker that
        stays unsent can stall a whole reconfiguration.
        """
        self.inbox.event.clear()
        if self.inputs.ready():
            return
        waits = [d.delay() or getattr(d.source, "poll_interval", None) or SOURCE_POLL_S for d in self.sources
                 if not (d.ended or d.paused or self.inputs.source_held(d))]
        waits += [left for _s, ch in self.outs if not ch.held and (left := ch.linger_left())]
        # The wait is backpressure (on a full channel's gate), not idle time, only while the flow
        # holds input back for a full channel: a paced source waiting for its schedule while one
        # routed channel waits for credit and another instance has room is idle (issue 15).
        blocked = self.inputs.holding_back()
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

    def snapshot(self) -> dict[str, dict]:
        """State, progress and source position of every operator (the PE is aligned and still)."""
        progress = self.chain.progress()
        drivers = {d.op_id: d.snapshot() for d in self.sources}
        return {op_id: {"state": op.snapshot(), "progress": progress[op_id], "driver": drivers.get(op_id)}
                for op_id, op in self.ops.items()}

    # -- the control port: all the PE host calls, each between the PE's turns ----------------
    async def hold(self, channel_ids: list[str], marker: Any, overtake: Iterable[str] = ()) -> None:
        """A reconfiguration begins upstream: send ``marker`` on these outputs and hold them (rewirer.py)."""
        async with self.turns.lock:
            self.rewirer.hold(channel_ids, marker, overtake)

    async def align(self, marker: Any, release: bool = False) -> None:
        """A reconfiguration replaces this PE: align on ``marker`` (:meth:`begin_align`)."""
        async with self.turns.lock:
            self.begin_align(marker, release)

    async def aligned_snapshot(self) -> dict[str, dict]:
        """:meth:`snapshot`, not while a turn in the PE's thread changes the operators."""
        async with self.turns.lock:
            return self.snapshot()

    async def rewire(self, outputs: list[OutputSpec], remove_outputs: list[str], add_inputs: list[InputSpec],
                     remove_inputs: list[str], edges: list | None, routing: dict | None,
                     copies: dict[str, str] | None, connect: tuple, lap: Callable[[str], None]) -> None:
        """A reconfiguration changes this PE, which stays: held outputs re-pointed (``connect``:
        :meth:`open_outputs`' arguments for the new channels), routers re-built, new inputs
        registered (``edges``: its operators' inputs now). ``lap`` marks each part's end."""
        async with self.turns.lock:
            lap("turn wait")
            if outputs or remove_outputs or routing:
                await self.rewirer.rewire(outputs, remove_outputs, lambda out: self._open_channel(out, *connect),
                                          routing, copies)
                lap("outputs")
            self.rewirer.set_inputs(add_inputs, remove_inputs, edges, copies)
            if edges is not None:
                self.spec = replace(self.spec, edges=edges)

    def alignment_status(self, marker: Any, channel_ids: list[str] | None = None) -> dict:
        """How far this PE is with ``marker``: ``missing``, ``progress`` and ``times`` of channel
        ids or ``"aligned"`` (see ``PEHost.pe_reconf_wait``). ``channel_ids`` None: the whole PE
        aligns (it is replaced); else it takes the marker from those channels (it stays)."""
        arrived = dict(self.aligner.seen.get(marker, {}))
        if channel_ids is None:
            progress = sum(c.tuples for c in list(self.receivers.values())) + sum(d.count for d in self.sources)
            progress += len(self.aligner.aligned_ops) + len(arrived) + sum(ch.batches for _s, ch in list(self.outs))
            if self.aligner.aligned and self.aligner.aligned_at is not None:
                arrived["aligned"] = self.aligner.aligned_at
            return {"missing": [] if self.aligner.aligned else ["aligned"], "progress": progress, "times": arrived}
        missing = [c for c in channel_ids if c not in arrived and not getattr(self.receivers.get(c), "ended", True)]
        progress = sum(getattr(self.receivers.get(c), "tuples", 0) + (c in arrived) for c in channel_ids)
        return {"missing": missing, "progress": progress + self.inputs.shipped_toward(self.receivers, channel_ids),
                "times": {c: at for c, at in arrived.items() if c in channel_ids}}

    async def begin_checkpoint(self, checkpoint_id: int, epoch: int) -> None:
        """The coordinator starts checkpoint ``checkpoint_id`` of ``epoch`` here (barriers.py)."""
        async with self.turns.lock:
            self.barriers.begin(checkpoint_id, epoch)

    def checkpoint_result(self, checkpoint_id: int, take: bool = False) -> dict | None:
        """This PE's snapshot for ``checkpoint_id`` once taken (``take``: handed over), else None.
        A PE whose inputs all ended before the barrier came takes it as it is, now."""
        if checkpoint_id not in self.barriers.results and self.state == "finished":
            self.barriers.begin(checkpoint_id)
        results = self.barriers.results
        return results.pop(checkpoint_id, None) if take else results.get(checkpoint_id)

    async def commit(self, checkpoint_id: int, complete: bool, still: Callable[[], bool] = lambda: True) -> None:
        """Checkpoint ``checkpoint_id`` is complete (sinks commit) or aborted; skipped when
        ``still()``, asked once the turn is there, says this PE was replaced meanwhile."""
        async with self.turns.lock:
            if not still():
                return
            if complete:
                await self.turns.off_loop(lambda: self.barriers.commit(checkpoint_id))
            else:
                self.barriers.abort(checkpoint_id)

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
            "full": sorted(self.inputs.full),       # producers of full output channels (flow.py)
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


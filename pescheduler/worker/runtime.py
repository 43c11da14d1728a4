"""A processing element at run time: its chain, inputs, outputs and loop.

Where a PE runs, and why: on the worker's event loop, yielding after every
batch (turns.py has the measurements and when a PE moves to a thread). The
loop bounds how long it holds the event loop (``pescheduler.pe.time-slice-ms``)
so heartbeats keep flowing. Its parts live beside it, each with one job: the
source pump (source_driver.py), its channel ends (ports.py), marker alignment
(aligner.py), turns (turns.py), input choice and flow gating (flow.py's
InputScheduler), a reconfiguration's side (rewirer.py), checkpoints
(barriers.py), the run's figures (pe_figures.py), and the wire specs it is
built from (pescheduler/wire.py). The PE host drives it only through its
control port: the methods under "the control port" below, each taken between
the PE's turns.
"""

from __future__ import annotations

import asyncio
import traceback
from time import perf_counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from ..operator import DeadLetter, OperatorContext
from ..wire import InputSpec, OutputSpec, PESpec
from .aligner import Aligner
from .barriers import Barriers, is_barrier
from .carried_input import carrying
from .chain import Chain
from .channels import DATA, ENCODED, END, MALFORMED, MARKER, WATERMARK, ChannelIn, Inbox, Rest, decode
from .flow import InputScheduler, slice_size
from .handshake import Credentials
from .lazy_restore import StillLoading, restoring, still_loading
from .pending_groups import PendingGroups, awaited, over_window, placeholder
from .pe_figures import RunFigures, operator_figures
from .ports import Connect, Ports
from .rewirer import Rewirer
from .source_driver import Sources
from .turns import Turns


@dataclass(frozen=True)
class Hosting:
    """What the PE host (pehost.py) gives each PE it builds, besides its spec."""

    worker: str                                     # the worker's address (the operators' context)
    credentials: Credentials | None = None          # the deployment's secret, TLS (handshake.py)
    checkpointing: bool = False                     # the deployment takes checkpoints
    state_backend: str = "memory"                   # the deployment's keyed-state backend
    on_change: Callable[[], None] = lambda: None    # the host's: a PE changed state


class PERunner:
    """Runs one PE: reads sources and channels, pushes batches through the chain, ships outputs."""

    def __init__(self, spec: PESpec, hosting: Hosting, spare_thread: ThreadPoolExecutor | None = None) -> None:
        self.spec, self.hosting = spec, hosting
        self.ops = {op_id: cls(**params) for op_id, (cls, params, _key) in spec.ops.items()}
        self.sources = Sources(self.ops, spec.batch_size, spec.latency_s)
        _restore(self.ops, self.sources, spec.restore)
        self.ports = Ports(spec, hosting.credentials, self._dead)
        self.chain: Chain | None = None
        self.turns = Turns(spec.pe_id, spec.time_slice_s, spare_thread, clock=self._busy_s)   # loop or thread
        _thread_if_blocking(self.ops, self.turns)
        self.aligner = Aligner()                   # markers seen, alignment (see aligner.py)
        self.barriers = Barriers(spec.pe_id, spec.epoch, self.ops, self.sources, self.aligner, self.ports,
                                 self.turns, self.checkpoint_snapshot, hosting.on_change)     # checkpoints
        # a source whose backlog waits at a broker reads no further than flow.SOURCE_BACKLOG
        self.inputs = InputScheduler(self.ports.inbox, self.ports.outs, spec.credits, spec.time_slice_s,
                                     self._busy_s, self.aligner.park, self._take, self.sources.broker_backed())
        self.rewirer = Rewirer(self.ports, self.aligner, self.inputs, self.sources, self.turns)
        self.ports.inbox.on_marker = self._marker_queued
        window = max(spec.hold, spec.credits * spec.batch_size)     # tuples a gated instance may hold (pending_groups.py)
        # instances built from key groups a running one exported: no input until the order wait's go
        self.inputs.holds = lambda: over_window(self.rewirer.pending, window)
        self.loader: Any = None                    # its restored key groups' Loader while they load (lazy_restore.py)
        self.restored_files: tuple[int, int] | None = None    # once loaded: files read from its worker's copies, from the storage
        self.figures = RunFigures()
        self.state = "created"                     # running, finished, failed, stopping (stop()), stopped
        self.error: str | None = None
        self.task: asyncio.Task | None = None
        self.tails: set[asyncio.Task] = set()      # shipping what a rewire after the end re-sent (rewire)

    @property
    def pe_id(self) -> str:
        return self.spec.pe_id

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
        outputs = self.ports.open((local_receivers, data_address, expect))
        self.chain = self.inputs.chain = self.rewirer.chain = Chain(
            self.ops, self.spec.edges, outputs, on_side=self.figures.side, routing=self.spec.routing,
            copies=self.spec.copies)
        self.rewirer.pending.update(_restore_progress(self.chain, self.spec))

    async def opened(self) -> None:
        """Return once every output channel is open; raise why one could not open."""
        await self.ports.opened()

    def receiver(self, channel_id: str) -> tuple[Inbox, ChannelIn]:
        """The inbox and receiving end of input channel ``channel_id`` (KeyError: not this PE's)."""
        return self.ports.receiver(channel_id)

    def _dead(self, item: Any, exc: BaseException | str, op_id: str) -> None:
        self.chain.dead_letters.append(DeadLetter.of(item, exc, op_id))

    # -- the loop -------------------------------------------------------------------
    def start(self) -> asyncio.Task:
        self.turns.bind()
        self.state = "running"
        self.task = asyncio.create_task(self.run(), name=f"pe {self.pe_id}")
        return self.task

    async def run(self) -> None:
        self.figures.start()
        try:
            _open(self.ops, self.spec, self.hosting)
            async with self.turns.lock:                  # sinks restored from a checkpoint settle it
                await self.turns.off_loop(lambda: self.barriers.restored(self.spec.restore))
            # A PE whose chain ended while a reconfiguration holds its outputs stays until the rewire: the
            # held data and the end it held back (Chain.freeze) still have to go out on the new channels, and
            # only this loop ships them (issue 16: a fast columnar source ended during a Replicate's pause).
            while not (self.chain.finished and not self.chain.frozen) and self.state != "stopping":
                progressed = await self.turns.run(self._work)
                if await self.inputs.flush() or progressed:    # input held back for a full channel may go now
                    await self.turns.between()      # let the worker answer its calls
                else:                       # nothing to do: wait for input, credit or a source due
                    await self.inputs.idle(lambda: self.sources.due_in(self.inputs.source_held)
                                           + self.ports.linger_waits(), self.figures.waiting)
            if self.state == "stopping":
                raise asyncio.CancelledError
            await self.ports.flush()            # every input ended: nothing left to defer (flow.py)
            self.state = "finished"
        except asyncio.CancelledError:
            self.state = "stopped"
            raise
        except Exception:
            self.state = "failed"
            self.error = f"PE {self.pe_id} on {self.hosting.worker} failed:\n{traceback.format_exc()}"
        finally:
            self.turns.close()                  # never close operators under a running turn
            self.chain.close()
            await self.ports.close()

    def _work(self) -> bool:
        self.barriers.check()                   # a sink's commit failed outside the loop: fail here
        return self.sources.pump(self.chain, self.inputs.source_held) | self.inputs.take()

    def _take(self, channel: ChannelIn, kind: int, payload: Any, deadline: float | None = None,
              whole_s: float = float("inf")) -> Rest | None:
        """Process one inbox item the scheduler took (flow.InputScheduler.take). A data batch is
        taken whole, or up to what fits before ``deadline`` (flow.slice_size; whole where it
        would take longer than ``whole_s``): its rest is returned, for the scheduler to put back
        in front. Its credit is granted, and it leaves the inbox's count, with its last slice."""
        chain = self.chain
        if kind == DATA:
            if type(payload) is Rest:
                batch = payload
            else:
                self.figures.input_came()
                try:
                    batch = decode(payload) if isinstance(payload, ENCODED) else payload
                except Exception as exc:    # a proven peer's unreadable batch: a dead letter, not a failure
                    self._taken(channel)
                    self._dead(bytes(payload[:256]), exc, f"channel {channel.channel_id}")
                    return None
            rest = None
            if deadline is not None and isinstance(batch, list):
                n = slice_size(len(batch), channel.tuple_s, deadline - perf_counter(), whole_s)
                if n < len(batch):
                    batch, rest = batch[:n], Rest(batch[n:])
            if rest is None:
                self._taken(channel)
            if not chain.take_input(channel.src_op, batch, channel.port):     # wired, yet nothing here takes it
                raise RuntimeError(f"channel {channel.channel_id} brought {len(batch)} tuples of {channel.src_op!r}, "
                                   f"which no operator of PE {self.pe_id} takes: they would be lost")
            channel.tuples += len(batch)
            return rest
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

    def _taken(self, channel: ChannelIn) -> None:
        """A data batch leaves the inbox (its last slice): its credit back to the sender."""
        self.ports.inbox.data_batches -= 1
        self.turns.on_loop(channel.grant)        # per batch, so the sender keeps pipelining

    def _busy_s(self) -> float:
        """Busy time the operators have counted so far (on busy_clock, by the chain and the source
        pump): what turns and input shares are timed on, without reading the clock again (a
        system call, about 3 us: 7% of both workers' samples at 1.6 tuples a batch, issue 15)."""
        chain = self.chain
        return sum(node.stats.busy_s for node in chain.nodes.values()) if chain is not None else 0.0

    # -- markers (see aligner.py; reconfigurations: rewirer.py, checkpoints: barriers.py) --
    def _on_marker(self, channel: ChannelIn, marker: Any) -> None:
        """A marker arrived behind all data before it on ``channel``: note it, maybe align."""
        if is_barrier(marker):
            if self.barriers.arrived(channel, marker, self._moving()):
                self.check_aligned()
            return
        self.aligner.arrived(channel.channel_id, marker)
        self.check_aligned()
        self.turns.on_loop(self.hosting.on_change)

    def _marker_queued(self, channel: ChannelIn, marker: Any) -> None:
        """A reconfiguration's marker is in the inbox, behind all ``channel`` carried before it: a
        Release's drain may wait for no more than that (``Rewirer.status``'s ``queued``)."""
        if not is_barrier(marker):
            self.turns.on_loop(self.hosting.on_change)

    def check_aligned(self) -> None:
        """Align the operators that now can; once the whole PE is, a checkpoint's snapshot is taken."""
        if self.aligner.advance(self.chain, self.ports.receivers.values()):
            if self.barriers.current is not None:
                self.barriers.aligned()          # snapshot taken, parked input back, sources on
            self.turns.on_loop(self.hosting.on_change)

    def _moving(self) -> bool:
        """Does anything still move here (a barrier is aligned on, not taken at once)?"""
        return self.state == "running" and self.chain is not None and not self.chain.finished

    def snapshot(self, leave_out: Iterable[str] = (), checkpoint: bool = False) -> dict[str, dict]:
        """State, progress and source position of every operator (the PE is aligned and still) but
        ``leave_out`` (a retired instance whose key groups all went to their new owners).
        While restored key groups still load (lazy_restore.py) a ``checkpoint``'s snapshot
        references the restored checkpoint's files for the groups not loaded yet (unchanged
        since), unless tuples taken before its barrier wait for such a group: that checkpoint is
        declined (the next one is taken), since neither the files nor the source positions would
        hold those tuples, and a restore from it lost them (the kills' property test, loaded).
        Any other snapshot is refused: a rescale would move state it does not hold."""
        loading = still_loading(self)
        if loading and not (checkpoint and self.loader is not None):
            raise StillLoading(f"{', '.join(loading)} still loading the key groups of its restore")
        held = sum(self.loader.gates[o].holding for o in loading if o in self.loader.gates) if loading else 0
        if held:
            raise StillLoading(f"{', '.join(loading)} hold {held} tuples for key groups of its restore not loaded "
                               f"yet: this checkpoint is declined")
        progress, drivers, skip = self.chain.progress(), self.sources.snapshot(), frozenset(leave_out)
        out = {op_id: {"state": op.snapshot(), "progress": progress[op_id], "driver": drivers.get(op_id)}
               for op_id, op in self.ops.items() if op_id not in skip}
        for op_id in (o for o in loading if o in out):
            out[op_id]["state"] = self.loader.with_unloaded(op_id, out[op_id]["state"])
        return out

    def checkpoint_snapshot(self) -> dict[str, dict]:
        """:meth:`snapshot` at a checkpoint's barrier (barriers.py)."""
        return self.snapshot(checkpoint=True)

    # -- the control port: all the PE host calls, each between the PE's turns ----------------
    async def hold(self, channel_ids: list[str], marker: Any, overtake: Iterable[str] = ()) -> None:
        """A reconfiguration begins upstream: send ``marker`` on these outputs and hold them (rewirer.py)."""
        async with self.turns.lock:
            self.rewirer.hold(channel_ids, marker, overtake)

    async def align(self, marker: Any, release: bool = False, carry: bool = False,
                    overdraw: Iterable[str] = ()) -> None:
        """A reconfiguration replaces this PE: align on ``marker`` (``Rewirer.align``). ``carry``:
        its key groups all go to gating instances and its queued input goes with them
        (``carried_input.py``; the plan chose it: ``plan.carry``). ``overdraw``: output channels
        that ship the marker and what precedes it without credit (``plan.overdraw``)."""
        async with self.turns.lock:
            if carry and self.chain is not None and self.rewirer.carried is None:     # once: it holds tuples
                self.rewirer.carried = carrying(self.chain, self.spec, self.rewirer.pending)
            self.rewirer.align(marker, release, overdraw)
            self.check_aligned()

    async def aligned_snapshot(self, leave_out: Iterable[str] = ()) -> dict[str, dict]:
        """:meth:`snapshot`, not while a turn in the PE's thread changes the operators."""
        async with self.turns.lock:
            return self.snapshot(leave_out)

    async def rewire(self, outputs: list[OutputSpec], remove_outputs: list[str], add_inputs: list[InputSpec],
                     remove_inputs: list[str], edges: list | None, routing: dict | None,
                     copies: dict[str, str] | None, connect: Connect, lap: Callable[[str], None],
                     before: Callable[[], None] = lambda: None) -> None:
        """A reconfiguration changes this PE, which stays: held outputs re-pointed (``connect``: :meth:`open_outputs`'
        arguments), routers re-built, new inputs registered (``edges``: its operators' inputs now). ``lap``
        marks each part's end; ``before`` runs in the same turn just before the routers switch (handover.py)."""
        async with self.turns.lock:
            lap("turn wait")
            before()
            lap("export")
            if outputs or remove_outputs or routing:
                await self.rewirer.rewire(outputs, remove_outputs, lambda out: self.ports.open_channel(out, connect),
                                          routing, copies)
                if self.state == "finished":
                    self._ship_after_end({out.channel_id for out in outputs})
                lap("outputs")
            self.rewirer.set_inputs(add_inputs, remove_inputs, edges, copies)
            if edges is not None:
                self.spec = replace(self.spec, edges=edges)

    def _ship_after_end(self, channel_ids: set[str]) -> None:
        """A rewire of a PE that finished (its source ended while the reconfiguration was planned):
        its new channels carry what the rewire re-sent, the END at least (``Rewirer._replay``),
        and no loop ships them any more, so this does (its last flush's ``Ports.flush``), then
        closes them. A channel that cannot ship fails the PE, as its last flush would have (the
        END would never reach its receiver)."""
        fresh = [channel for _spec, channel in self.ports.outs if channel.channel_id in channel_ids]

        async def ship() -> None:
            try:
                await self.ports.flush()
                for channel in fresh:
                    await channel.close()
            except Exception:
                self.state = "failed"
                self.error = (f"PE {self.pe_id} on {self.hosting.worker} could not ship what a rewire after its "
                              f"end re-sent:\n{traceback.format_exc()}")
        if fresh:
            tail = asyncio.create_task(ship(), name=f"pe {self.pe_id} after its end")
            self.tails.add(tail)
            tail.add_done_callback(self.tails.discard)

    async def open_early(self, outputs: list[OutputSpec], add_inputs: list[InputSpec], connect: Connect) -> None:
        """Before a reconfiguration's pause: new input channels registered and new output channels
        opened, none of them routed yet (:meth:`rewire` switches to them later; ``Rewirer.open``).
        Await :meth:`opened_early` outside the turn for their connects."""
        async with self.turns.lock:
            self.rewirer.open(outputs, lambda out: self.ports.open_channel(out, connect))
            self.rewirer.set_inputs(add_inputs, [])

    def opening(self) -> bool:
        """Is an output channel still being opened?"""
        return any(channel.opening is not None for _spec, channel in self.ports.outs)

    async def opened_early(self) -> None:
        """Return once the channels :meth:`open_early` began are open (raise why one could not)."""
        await asyncio.gather(*(channel.opened() for channel in list(self.rewirer.early.values())))

    def alignment_status(self, marker: Any, channel_ids: list[str] | None = None, queued: Iterable[str] = ()) -> dict:
        """How far this PE is with ``marker`` (``Rewirer.status``; ``PEHost.pe_reconf_wait``)."""
        return self.rewirer.status(marker, channel_ids, queued)

    async def begin_checkpoint(self, checkpoint_id: int, epoch: int) -> None:
        """The coordinator starts checkpoint ``checkpoint_id`` of ``epoch`` here (barriers.py)."""
        async with self.turns.lock:
            if self.barriers.begin(checkpoint_id, epoch, self._moving()):
                self.check_aligned()

    def checkpoint_result(self, checkpoint_id: int, take: bool = False) -> dict | None:
        """This PE's snapshot for ``checkpoint_id`` once taken (``take``: handed over), else None.
        A PE whose inputs all ended before the barrier came takes it as it is, now."""
        if checkpoint_id not in self.barriers.results and self.state == "finished":
            self.barriers.begin(checkpoint_id, moving=False)
        results = self.barriers.results
        return results.pop(checkpoint_id, None) if take else results.get(checkpoint_id)

    async def commit(self, checkpoint_id: int, complete: bool, still: Callable[[], bool] = lambda: True) -> None:
        """Checkpoint ``checkpoint_id`` is complete (sinks commit) or aborted; skipped when
        ``still()``, asked once the turn is there, says this PE was replaced meanwhile."""
        async with self.turns.lock:
            if still():
                await self.turns.off_loop(lambda: self.barriers.settle(checkpoint_id, complete))

    def stop(self) -> None:
        """End the loop at its next turn (and cancel it: either alone would do, both are sure)."""
        self.state = "stopping"
        self.ports.wake()
        if self.task is not None:
            self.task.cancel()
        for tail in list(self.tails):
            tail.cancel()

    def drain(self) -> bool:
        """End this PE's sources at the next loop turn (a graceful stop); False if it has none."""
        drained = self.sources.drain()
        self.ports.wake()
        return drained

    # -- monitoring -----------------------------------------------------------------
    def stats(self) -> dict:
        """Cumulative counters; the controller turns differences into rates and fractions."""
        chain, aligner = self.chain, self.aligner
        return {
            "pe": self.pe_id, "state": self.state, "error": self.error, **self.figures.stats(),
            "threaded": bool(self.turns.thread), "threaded_because": self.turns.threaded_because,
            "routers": chain.router_counts() if chain else {}, "operators": operator_figures(chain, self.sources),
            **self.ports.stats(list(aligner.seen.values())),    # a copy: a turn in the PE's thread may add one
            "full": sorted(self.inputs.full),       # producers of full output channels (flow.py)
            "aligning": aligner.marker is not None and not aligner.aligned,
            "frozen": sorted(chain.frozen) if chain else [],
            **({"restoring": loading} if (loading := restoring(self)) else {}),   # lazy_restore.py
            **({"restored_files": list(self.restored_files)} if self.restored_files else {}),
        }

    def take_dead_letters(self) -> list[DeadLetter]:
        chain = self.chain
        return chain.take_dead_letters() if chain is not None and chain.dead_letters else []


def _restore(ops: dict[str, Any], sources: Sources, restore: dict[str, dict]) -> None:
    """Operators and source drivers restored from a checkpoint (before open(): they continue)."""
    for op_id, saved in restore.items():
        if placeholder(saved):                        # state on its way (pending_groups.py)
            continue
        ops[op_id].restore(saved["state"])
        if saved.get("position") is not None:         # a checkpoint's durable source position
            ops[op_id].seek(saved["position"])
    sources.restore(restore)


def _restore_progress(chain: Chain, spec: PESpec) -> dict[str, PendingGroups]:
    """Watermark progress restored into a new chain; the gates of its instances whose moved key
    groups are still on their way (pending_groups.py)."""
    progress = {op: saved["progress"] for op, saved in spec.restore.items() if not placeholder(saved)}
    if progress:
        chain.restore_progress(progress)
    return awaited(chain, spec)


def _open(ops: dict[str, Any], spec: PESpec, hosting: Hosting) -> None:
    """Open every operator with its context (``context.extra``: what the deployment tells it)."""
    extra = {"checkpoint": hosting.checkpointing, "state": hosting.state_backend, "deployment": spec.deployment}
    for op_id, op in ops.items():
        _cls, _params, key_field = spec.ops[op_id]
        inputs = [src for src, _port, dst in spec.edges if dst == op_id]
        op.open(OperatorContext(op_id=op_id, pe_id=spec.pe_id, worker=hosting.worker, key_field=key_field,
                                extra={"inputs": inputs, **extra}))


def _thread_if_blocking(ops: dict, turns: Turns) -> None:
    """A PE holding an operator that may wait on an external system (``may_block``: a sink
    retrying a delivery) works in its thread from the start: never on the worker's loop, where
    seconds of retries would silence its heartbeats and control calls."""
    waits = [op_id for op_id, op in ops.items() if op.may_block]
    if waits:
        turns.go_threaded(f"{waits[0]} may wait on deliveries")

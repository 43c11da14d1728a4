"""Channels between PEs: batched, credit-based, markers in-band.

Why plain asyncio TCP and pickle-5 rather than ``distributed.comm``: measured
on this kind of machine, a small header plus a pickle-5 payload moved 4.5-5.6 M
small tuples/s between two processes, ``distributed.comm`` 1.2 M at batch 100;
msgpack encodes and decodes the generator's event dicts more slowly than
pickle (3.7/1.9 M/s against 4.1/2.1 M/s). Decoding allocates a dict per tuple,
so the cyclic GC is paused around ``pickle.loads`` (tuples hold no cycles):
that lifts decoding from about 2.2 to 3.1 M tuples/s. A row wire for batches
of one schema (keys once, values as tuples by ``itemgetter``, dicts rebuilt
by ``dict(zip())``) lost end to end, consumer's read of ``ts`` included: 0.31
against pickle's 0.58 M tuples/s per CPU second (same run, load 11); even a
consumer reading the tuples themselves (0.56) did not beat it, the sender's
check that every dict has the same keys in the same order costing what the
receiver saves.

Flow control: the receiver grants credit, one per data batch it has taken
from its inbox; a sender starts with ``pescheduler.channel.credits`` and waits
(counted as backpressure) when it has none. Memory per channel is therefore
bounded by ``credits`` batches, however slow the consumer. Watermarks, end of
stream and (later) reconfiguration/checkpoint markers travel on the same
stream behind the data they follow and take no credit.

Latency target (``pescheduler.batch.latency``, ``deploy(latency=)``), sized by
throughput as Flink's buffer debloating: each channel measures the rate it ships
(an average over its batches) and aims its batches at what arrives in half the
target, from one tuple (an idle channel ships at once) to ``batch.size`` (a busy
one ships full batches, as a fixed linger did, and pays the per-batch costs --
a turn, the busy clock, a credit, a socket write on both sides (issue 15) -- no
more often than the rate needs). Buffered data goes when it reaches that size,
fills a batch, or its oldest tuple has waited the target, whichever comes
first, so no tuple waits in a channel longer than the target, and a busy
channel's tuples about half of it. The small batches it holds go as one (up to
``batch.size`` tuples). Issue 34 measured what a fixed linger costs: p99 6.3 ms
across two PEs at 1 k and 10 k events/s with a 5 ms linger waiting for batches
that never filled; the next rule (at once to an idle receiver, else at most a
batch per linger) measured p99 15.4 ms at half the capacity against the fixed
linger's 8.8 ms (quiet machine, one run).

What must not wait goes at once, with the data ahead of it: markers,
checkpoint barriers and end of stream (no added latency on reconfiguration,
checkpoints or at the end), and what a watermark or end-of-stream callback
emitted (a window's fire: :meth:`ChannelOut.urge`). A watermark (a window
downstream fires on it) goes at once when no batch went for a target, else a
target after the last batch: event time downstream lags at most the target,
and a trickle whose every read advances the watermark still ships batches, not
a tuple a batch (issue 15). Of the watermarks between batches that go as one
only the newest goes, behind them (only the newest matters; records are then
judged by it, as by Flink's periodic watermarks). With a target of 0 every
batch goes as it was emitted, as credit allows.

Two PEs on one worker exchange batch objects in memory (no serialisation)
through the same gate.

Columnar batches (``pyarrow.RecordBatch``) travel as one Arrow IPC stream
message each: no per-row work on either side, and the receiver reads the
columns straight out of the frame (zero-copy). A data frame is Arrow when it
starts with the IPC continuation marker, which no pickle can start with.

Who may connect (handshake.py): the data server speaks first with a nonce;
until the sender proved with an HMAC that it holds the deployment's secret,
only one small HELLO frame is read and no receiver is touched. Markers are
msgpack, never pickle; data batches are unpickled only from a proven peer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import struct
import sys
from collections import deque
from time import perf_counter, time
from typing import Any, Callable

from . import handshake
from .gc_pause import gc_paused
from .handshake import Credentials, HandshakeRefused

DATA, WATERMARK, END, CREDIT, HELLO, MARKER = 1, 2, 3, 4, 5, 6
_HOLD = 0                                # local to a sender's buffer: never on the wire
KIND_NAMES = {DATA: "DATA", WATERMARK: "WM", END: "END", MARKER: "MARKER", _HOLD: "HOLD"}
CHALLENGE, WELCOME = 16, 17              # the handshake (handshake.py): server nonce, server proof
MALFORMED = -1                           # local to an inbox: a frame a proven peer sent that cannot be read
logger = logging.getLogger(__name__)
HEADER = struct.Struct("!IB")           # payload length, kind
WM = struct.Struct("!q")
COUNT = struct.Struct("!I")


ARROW_IPC = b"\xff\xff\xff\xff"         # an Arrow IPC message's continuation marker
WRITE_BUFFER = 8 << 20                  # bytes a sender's transport may hold before drain() waits
FILL = 0.5                              # a batch aims at what arrives in this share of the latency target
RATE_WEIGHT = 0.25                      # weight of the newest batch in a channel's measured rate


def batch_target(rate: float, latency_s: float, batch_size: int) -> int:
    """Tuples a batch aims at (module doc): what arrives at ``rate`` tuples/s in ``FILL`` of the
    latency target, from one (ship at once) to ``batch_size`` (a full batch)."""
    return min(batch_size, max(1, round(rate * latency_s * FILL)))


def encode(batch: list, dead_letter: Callable[[Any, BaseException], None]) -> bytes:
    """Pickle a batch; tuples that cannot be pickled are dead-lettered, the rest go.
    A RecordBatch becomes an Arrow IPC stream."""
    if not isinstance(batch, list):
        return _arrow_encode(batch)
    try:
        return pickle.dumps(batch, protocol=5)
    except Exception:
        good = []
        for item in batch:
            try:
                pickle.dumps(item, protocol=5)
            except Exception as exc:
                dead_letter(item, exc)
            else:
                good.append(item)
        return pickle.dumps(good, protocol=5)


def _arrow_encode(batch: Any, reserve: int = 0) -> memoryview:
    """One IPC stream (schema, dictionaries, batch, end) written into a buffer of exactly its size
    from Arrow's memory pool, after ``reserve`` free bytes (the frame header): sized by a dry run,
    so the columns are copied once and never regrown (1.7x a growing BufferOutputStream), into
    memory the pool already has mapped (a fresh bytearray was zeroed and page-faulted in per
    frame: 1.3 ms against 0.8 ms for 2.4 MB). The view keeps the Arrow buffer alive."""
    import pyarrow as pa

    mock = pa.MockOutputStream()
    with pa.ipc.new_stream(mock, batch.schema) as writer:
        writer.write_batch(batch)
    out = memoryview(pa.allocate_buffer(reserve + mock.size())).cast("B")
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(pa.py_buffer(out[reserve:])), batch.schema) as writer:
        writer.write_batch(batch)
    return out


ENCODED = (bytes, bytearray, memoryview)      # a data payload still to decode (off the wire)


def decode(payload: bytes | bytearray | memoryview) -> Any:
    """Unpickle a batch with the cyclic GC paused (tuples are acyclic; see module doc); an Arrow
    frame is opened in place (its arrays keep the frame's buffer alive)."""
    if payload[:4] == ARROW_IPC:
        import pyarrow as pa

        owner = payload.obj if isinstance(payload, memoryview) else None
        if not (isinstance(owner, pa.Buffer) and owner.size == payload.nbytes):
            owner = pa.py_buffer(payload)       # bytes: the arrays hold the Python object instead
        return pa.ipc.open_stream(owner).read_next_batch()
    return gc_paused(pickle.loads, payload)


class CreditGate:
    """Credits a sender holds; waiting for one is backpressure, and is timed."""

    __slots__ = ("credits", "overdrawn", "_event", "_blocked_s", "_since", "wake")

    def __init__(self, credits: int) -> None:
        self.credits = credits
        self.overdrawn = False        # past credit: nothing waits any more (overdraw)
        self._event = asyncio.Event()
        self._blocked_s = 0.0
        self._since: float | None = None          # when the current wait began
        self.wake: Callable[[], None] = lambda: None    # also told of credit (the PE's idle wait)

    @property
    def blocked_s(self) -> float:
        """Seconds blocked so far, the wait in progress included (a sample may land mid-wait)."""
        return self._blocked_s + (perf_counter() - self._since if self._since is not None else 0.0)

    def begin_wait(self) -> None:
        self._since = perf_counter()

    def end_wait(self) -> None:
        self._blocked_s += perf_counter() - self._since
        self._since = None

    def available(self) -> bool:
        """Would :meth:`acquire` return at once?"""
        return self.credits > 0 or self.overdrawn

    def overdraw(self) -> None:
        """From now on :meth:`acquire` never waits; a wait in progress ends. For a PE going away
        whose consumer need only have its marker queued (``protocol._overdrawn``): what it
        buffers and still emits before the marker goes to the consumer's inbox at once, up to
        the backlog a full channel may build (flow.py) beside the credit window, once, instead
        of waiting in this channel for credit; the credit granted for it comes back to a channel
        that sends nothing after the marker."""
        self.overdrawn = True
        self._event.set()
        self.wake()

    async def acquire(self) -> None:
        if not self.available():
            self.begin_wait()
            try:
                while not self.available():
                    self._event.clear()
                    await self._event.wait()
            finally:
                self.end_wait()
        self.credits -= 1

    def release(self, n: int = 1) -> None:
        self.credits += n
        self._event.set()
        self.wake()


class Rest(list):
    """The tuples of a data batch that a turn left for the next (flow.py's slices): back in front of
    the inbox as a data item of its own, its batch's credit not granted and its count kept until
    the batch's last slice is taken."""

    __slots__ = ()


class Inbox:
    """A PE's input: ``(channel, kind, payload)`` in arrival order, and a wake-up event."""

    def __init__(self) -> None:
        self.items: deque = deque()
        self.event = asyncio.Event()
        self.data_batches = 0          # data batches queued now (markers excluded)
        self.max_data_batches = 0      # the most ever queued: bounded by the credit window
        # told of each marker queued (the PE: a reconfiguration's drain may wait for that, not its take)
        self.on_marker: Callable[["ChannelIn", Any], None] = lambda channel, marker: None

    def put(self, channel: "ChannelIn", kind: int, payload: Any) -> None:
        self.items.append((channel, kind, payload))
        if kind == DATA:
            self.data_batches += 1
            if self.data_batches > self.max_data_batches:
                self.max_data_batches = self.data_batches
        elif kind == MARKER:
            channel.queued, channel.queued_at = payload, time()
            self.on_marker(channel, payload)
        self.event.set()

    def queued_tuples(self) -> int:
        # A copy first (one C call under the GIL): a PE working in its thread pops items while
        # the event loop asks for stats, and iterating the deque itself would raise.
        return sum(len(p) for _c, k, p in list(self.items) if k == DATA and isinstance(p, list))


class ChannelIn:
    """The receiving end of one channel: which upstream port it carries, and how to grant credit."""

    def __init__(self, channel_id: str, src_op: str, port: str, wired: bool = True) -> None:
        self.channel_id = channel_id
        self.src_op = src_op
        self.port = port
        self.grant: Callable[[], None] = lambda: None
        self.tuples = 0
        self.tuple_s = 0.0      # busy time a tuple of its last batch took (flow.py slices a batch by it)
        self.ended = False
        # Does the chain route what this channel carries? Not yet for a channel opened before its edge
        # (a Replicate's copy, protocol._open_early): its items wait in the inbox until the edge comes
        # (Rewirer.set_inputs), or a batch taken before then went nowhere.
        self.wired = wired
        # the last marker queued here, and when: everything the channel carried before it is in this
        # worker's memory, ahead of it in the inbox (a Release's drain, control/protocol.py's late_seen)
        self.queued: Any = None
        self.queued_at: float | None = None


class ChannelOut:
    """The sending end: buffers what the chain emits; :meth:`flush` ships it as credit allows.

    Subclasses implement ``_write(kind, payload)``. The ``send``/``watermark``/
    ``end`` methods only buffer (the chain calls them synchronously);
    the PE loop awaits :meth:`flush` after each input batch.
    """

    def __init__(self, channel_id: str, credits: int, latency_s: float = 0.0, batch_size: int = 1000) -> None:
        self.channel_id = channel_id
        self.gate = CreditGate(credits)
        self.pending: deque = deque()
        self.latency_s = latency_s  # the most a tuple waits here for more (module doc); 0: never
        self.batch_size = batch_size
        self.rate = 0.0            # tuples/s shipped, averaged over batches (with a target only)
        self.target = 1            # tuples a batch aims at (batch_target of the rate)
        self._shipped_at = float("-inf")   # when the last data batch went (with a target only)
        self._tuples = 0           # data tuples buffered (with a target only)
        self._since: float | None = None   # when the oldest of them was buffered (with a target only)
        self._urgent = False       # a control item or a fire's results: ship everything now
        self._wm_waits = False     # a watermark is buffered: it goes a target after the last batch at the latest
        self.tuples = 0
        self.batches = 0
        self.ended = False
        self.held = False          # paused at a reconfiguration marker: ship nothing more
        self.holding = False       # a hold was asked (held once what precedes the marker shipped)
        self.dst_ops: tuple[str, ...] = ()    # consumers this channel reaches (for routers)
        self.opening: asyncio.Future | None = None    # still being opened (see open_in_background)

    def open_in_background(self, opening) -> None:
        """Open with ``opening`` (a coroutine) while the PE already runs: until it is done the
        channel holds no credit, so what the chain emits waits in ``pending`` (bounded as by any
        credit wait) and a PE copy works from its first batch on, not from its last connect
        (issue 15: the downstream worker's busy loop answered a handshake in 50-100 ms).
        A failed opening fails every later :meth:`flush` and :meth:`opened`."""
        credits, self.gate.credits = self.gate.credits, 0

        async def run() -> None:
            await opening
            self.opening = None
            self.gate.release(credits)
        self.opening = asyncio.ensure_future(run())

    async def opened(self) -> None:
        """Return once the channel is open (at once when it is, or was closed while opening);
        raise why it could not open."""
        opening = self.opening
        if opening is None:
            return
        try:
            await asyncio.shield(opening)
        except asyncio.CancelledError:
            if not opening.cancelled():          # the caller itself is cancelled
                raise

    def can_ship(self) -> bool:
        """Something buffered could go now without waiting: open, and credit or a control item first."""
        return (bool(self.pending) and self.opening is None
                and (self.pending[0][0] != DATA or (self.gate.available() and self.ripe())))

    def ripe(self) -> bool:
        """May the buffered data go now? Always without a latency target; with one, once it
        reaches the batch the rate asks for, something urgent waits behind it, or its oldest
        tuple has waited the target (module doc)."""
        return (not self.latency_s or self._urgent or self._tuples >= self.target or self._since is None
                or perf_counter() >= self._deadline())

    def _deadline(self) -> float:
        """When the buffered data goes at the latest: the target after its oldest tuple, or with a
        watermark behind it the target after the last batch went (at once after a quiet target)."""
        return (min(self._since, self._shipped_at) if self._wm_waits else self._since) + self.latency_s

    def linger_left(self) -> float | None:
        """Seconds until the buffered data ripens; None when none waits to (the PE's idle wait)."""
        if not self.latency_s or not self._tuples or self._urgent or self._tuples >= self.target \
                or self._since is None:
            return None
        left = self._deadline() - perf_counter()
        return left if left > 0 else None

    def urge(self) -> None:
        """Ship what is buffered at once (what a window's fire emitted: it waited for event time
        already, so it does not wait for more data)."""
        if self.pending:
            self._urgent = True

    # Output protocol (synchronous, from the chain)
    def send(self, batch: list) -> None:
        if len(batch) > self.batch_size and isinstance(batch, list):
            self._slice(batch)
        else:
            self.pending.append((DATA, batch))
        if self.latency_s:
            if not self._tuples:
                self._since = perf_counter()
            self._tuples += len(batch)

    def _slice(self, batch: list) -> None:
        """A batch larger than ``batch_size`` (a window firing many keys at once) is buffered as
        slices of ``batch_size``, in order: each takes a credit and ships as a frame of its own, so
        the PE encodes one credit window of them and goes on with its other input, the rest going as
        credit comes back, and the receiver works on the first slices while later ones are still
        encoded (one frame of 100 k results stalled the PE for 42-67 ms, issue 34)."""
        size = self.batch_size
        self.pending.extend((DATA, batch[i:i + size]) for i in range(0, len(batch), size))

    def watermark(self, wm: int) -> None:
        if self.pending and self.pending[-1][0] == WATERMARK:
            self.pending[-1] = (WATERMARK, wm)      # only the newest watermark matters
        else:
            self.pending.append((WATERMARK, wm))
        self._wm_waits = True                       # a window downstream fires on it (_deadline)

    def end(self) -> None:
        self.pending.append((END, None))
        self.ended = True
        self._urgent = True

    def hold(self, marker: Any, overtake: bool = False) -> int | None:
        """Ship everything buffered, then ``marker``, then nothing until rewired.

        What the chain emits after this stays in ``pending`` (bounded by the
        pause) and is handed to the replacement channels by :meth:`take_held`.
        A channel that already ended carries no marker: END aligns as well.

        ``overtake``: the marker goes ahead of the data buffered, which stays
        behind the hold and is re-sent on the new route with the rest (as
        Flink's unaligned checkpoints let a barrier overtake buffered data), so
        the receiver drains at most the credit window already shipped, not the
        backlog a loaded sender built. Only for channels whose re-sent data goes
        to PEs the reconfiguration creates, or to instances that gate its key
        groups behind what the receiver carries (protocol._overtakable). The
        buffered watermarks are taken out and the newest is returned: it must
        follow the re-sent data, as the watermarks held back after the hold do
        (Chain.freeze); re-sent between two held channels' backlogs it would
        make the other's data late. A channel that ended does not overtake.
        """
        self.holding = True
        self._urgent = True
        if overtake and not self.ended:
            # In place: a flush awaiting credit or the socket holds this very deque.
            newest = next((p for kind, p in reversed(self.pending) if kind == WATERMARK), None)
            backlog = [item for item in self.pending if item[0] != WATERMARK]
            self.pending.clear()
            self.pending.extend([(MARKER, marker), (_HOLD, None), *backlog])
            return newest
        if not self.ended:
            self.pending.append((MARKER, marker))
        self.pending.append((_HOLD, None))
        return None

    def marker(self, marker: Any) -> None:
        """Ship ``marker`` behind everything buffered and go on (a checkpoint barrier; an ended
        channel carries none: END aligns as well)."""
        if not self.ended:
            self.pending.append((MARKER, marker))
            self._urgent = True

    def take_held(self) -> list:
        """The items emitted after the hold, to be re-sent on the replacement channels."""
        items = [item for item in self.pending if item[0] != _HOLD]
        self.pending.clear()
        self._tuples, self._since, self._urgent, self._wm_waits = 0, None, False, False
        return items

    async def flush(self, wait: bool = True) -> bool:
        """Ship everything buffered, waiting for credit before each data batch.

        ``wait=False`` ships what credit allows and returns False at the first
        data batch it has no credit for (True when nothing is left to ship);
        data that lingers (module doc) stays, and counts as shipped. ``wait=True``
        ships everything, lingering data included.
        """
        pending = self.pending
        if self.opening is not None and pending and not self.held:
            if not wait:
                return False
            await self.opened()
        while pending and not self.held:
            kind, payload = pending[0]
            if kind == DATA:
                if not wait and not self.ripe():
                    return True
                if not wait and not self.gate.available():
                    return False
            pending.popleft()
            if kind == _HOLD:
                self.held = True
                self._urgent = any(k != DATA and k != WATERMARK for k, _p in pending)
                return True
            if kind == DATA:
                await self.gate.acquire()
                if self.latency_s:
                    payload = self._coalesce(payload)
                    self._measure(len(payload))
                self.tuples += len(payload)
                self.batches += 1
            elif kind == WATERMARK:
                self._wm_waits = False
            await self._write(kind, payload)
        if not pending:
            self._urgent = False
        return True

    def _measure(self, shipped: int) -> None:
        """A batch of ``shipped`` tuples goes now: fold the rate since the last one into the
        channel's rate and size the next batch by it (``batch_target``). A sample is capped at the
        rate that fills a batch: two batches shipped back to back (credit back after a wait) would
        otherwise read as an endless rate, and the average would take many batches to come down."""
        now = perf_counter()
        gap = now - self._shipped_at
        self._shipped_at = now
        if gap > 0:
            sample = min(shipped / gap, self.batch_size / (self.latency_s * FILL))
            self.rate = sample if not self.rate else self.rate + RATE_WEIGHT * (sample - self.rate)
            self.target = batch_target(self.rate, self.latency_s, self.batch_size)

    def _coalesce(self, batch: Any) -> Any:
        """``batch`` (just taken from ``pending``) and the list batches right behind it, up to
        ``batch_size`` tuples, as one new list (the batch objects themselves stay as they are:
        fan-out channels share them). Watermarks between them are passed over and the newest
        goes right behind (module doc). Runs without an ``await`` after the credit is taken."""
        pending, room = self.pending, self.batch_size - len(batch)
        merged, wm = None, None
        if isinstance(batch, list):
            while pending and room > 0:
                kind, payload = pending[0]
                if kind == WATERMARK:
                    wm = payload
                elif kind != DATA or not isinstance(payload, list) or len(payload) > room:
                    break
                else:
                    if merged is None:
                        merged = list(batch)
                    merged += payload
                    room -= len(payload)
                    self._tuples -= len(payload)
                pending.popleft()
        if wm is not None and not (pending and pending[0][0] == WATERMARK):
            pending.appendleft((WATERMARK, wm))     # a newer one next would supersede it
        self._tuples -= len(batch)
        if self._tuples <= 0:
            self._tuples, self._since = 0, None
        return batch if merged is None else merged

    def data_pending(self) -> int:
        """Data batches buffered, not yet shipped (with a target: as they will go, coalesced)."""
        if self.latency_s:
            return -(-self._tuples // self.batch_size)
        return sum(1 for kind, _ in self.pending if kind == DATA)

    def head(self, n: int = 4) -> str:
        """The kinds of the first ``n`` items buffered, and the channel's flags (a drain's report:
        which item a receiver waits behind, and why it does not go)."""
        kinds = [KIND_NAMES.get(kind, str(kind)) for kind, _p in itertools.islice(self.pending, n)]
        if len(self.pending) > n:
            kinds.append("...")
        flags = [name for name, on in (("ended", self.ended), ("holding", self.holding),
                                       ("opening", self.opening is not None)) if on]
        return " ".join(([",".join(kinds)] if kinds else []) + ([f"({' '.join(flags)})"] if flags else []))

    def full(self, backlog: int) -> bool:
        """Out of credit with ``backlog`` data batches buffered (worker/flow.py). A held channel
        never is: it waits for the rewire, not for credit; nor is one that overdraws."""
        return not self.held and not self.gate.available() and self.data_pending() >= backlog

    async def _write(self, kind: int, payload: Any) -> None:
        raise NotImplementedError

    async def close(self, timeout: float = 10.0) -> None:
        """Release the transport (nothing to do for in-memory channels)."""
        if self.opening is not None:
            self.opening.cancel()


class LocalChannelOut(ChannelOut):
    """Same-worker channel: the batch object itself goes into the receiver's inbox.

    Without ``inbox`` and ``receiver`` it is opened by :meth:`attach` once the
    receiving PE is there (``open_in_background``)."""

    def __init__(self, channel_id: str, credits: int, inbox: Inbox | None = None,
                 receiver: ChannelIn | None = None, latency_s: float = 0.0, batch_size: int = 1000) -> None:
        super().__init__(channel_id, credits, latency_s, batch_size)
        if receiver is not None:
            self.attach(inbox, receiver)

    def attach(self, inbox: Inbox, receiver: ChannelIn) -> None:
        self.inbox = inbox
        self.receiver = receiver
        receiver.grant = self.gate.release

    def attach_later(self, expect: Callable[[str], Any]) -> None:
        """Attach once ``expect(channel_id)`` yields the receiver (a PE still being deployed here)."""
        async def attach() -> None:
            self.attach(*await expect(self.channel_id))
        self.open_in_background(attach())

    async def _write(self, kind: int, payload: Any) -> None:
        self.inbox.put(self.receiver, kind, payload)


class TcpChannelOut(ChannelOut):
    """Cross-worker channel over one TCP connection; credits come back on the same socket."""

    def __init__(self, channel_id: str, credits: int, dead_letter: Callable[[Any, BaseException], None],
                 latency_s: float = 0.0, batch_size: int = 1000) -> None:
        super().__init__(channel_id, credits, latency_s, batch_size)
        self.dead_letter = dead_letter
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self._credit_task: asyncio.Task | None = None

    async def connect(self, address: str, credentials: Credentials) -> None:
        """Connect (TLS when ``credentials.ssl``), prove the deployment's secret, check the server's."""
        self.open(address, credentials)
        await self.opened()

    def open(self, address: str, credentials: Credentials) -> None:
        """:meth:`connect` in the background (``open_in_background``): the PE need not wait."""
        self.open_in_background(self._connect(address, credentials))

    async def _connect(self, address: str, credentials: Credentials) -> None:
        host, port = address.rsplit(":", 1)
        try:
            async with asyncio.timeout(handshake.HANDSHAKE_TIMEOUT_S):
                self.reader, self.writer = await asyncio.open_connection(host, int(port), ssl=credentials.ssl)
                await self._handshake(credentials.secret, address)
        except TimeoutError:
            if self.writer is not None:
                self.writer.transport.abort()
            raise HandshakeRefused(f"the data server at {address} did not accept channel {self.channel_id!r} "
                                   f"within {handshake.HANDSHAKE_TIMEOUT_S:g} s (no receiver for it there?)") from None
        # drain() returns once the transport holds less than this: with asyncio's 64 KiB default
        # an Arrow frame (megabytes) was sent to the last byte before the PE could read and encode
        # the next one. Memory stays bounded by the credits (one frame each), as before.
        self.writer.transport.set_write_buffer_limits(high=WRITE_BUFFER)
        self._credit_task = asyncio.create_task(self._read_credits(), name=f"credits {self.channel_id}")

    async def _handshake(self, secret: bytes, address: str) -> None:
        try:
            server_nonce = await self._expect(CHALLENGE)
            mine = handshake.new_nonce()
            hello = handshake.encode_hello(self.channel_id, mine,
                                           handshake.client_proof(secret, server_nonce, mine, self.channel_id))
            self.writer.write(HEADER.pack(len(hello), HELLO) + hello)
            await self.writer.drain()
            proof = await self._expect(WELCOME)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.writer.transport.abort()
            raise HandshakeRefused(f"the data server at {address} closed channel {self.channel_id!r} "
                                   f"during the handshake (no receiver for it there?): {exc!r}") from None
        if not handshake.verify(handshake.server_proof(secret, server_nonce, mine, self.channel_id), proof):
            self.writer.transport.abort()
            raise HandshakeRefused(f"the data server at {address} did not prove it belongs to this "
                                   f"deployment (channel {self.channel_id!r})")

    async def _expect(self, kind: int) -> bytes:
        length, got = HEADER.unpack(await self.reader.readexactly(HEADER.size))
        if got != kind or length > handshake.MAX_HELLO_BYTES:
            raise ConnectionError(f"expected frame kind {kind}, got {got} ({length} bytes)")
        return await self.reader.readexactly(length)

    async def _read_credits(self) -> None:
        reader = self.reader
        try:
            while True:
                length, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
                body = await reader.readexactly(length)
                if kind == CREDIT:
                    self.gate.release(COUNT.unpack(body)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    async def _write(self, kind: int, payload: Any) -> None:
        # One write per frame, header and body together: two writes cost two send() calls and,
        # with TCP_NODELAY, a 5-byte segment of their own.
        if kind == DATA and not isinstance(payload, list):
            frame = _arrow_encode(payload, HEADER.size)          # written in place after the header
            HEADER.pack_into(frame, 0, len(frame) - HEADER.size, DATA)
            self.writer.write(frame)    # what send() does not take, asyncio copies; the PE goes on
        else:
            if kind == DATA:
                body = encode(payload, self.dead_letter)
            elif kind == WATERMARK:
                body = WM.pack(payload)
            elif kind == MARKER:
                body = handshake.encode_control(payload)
            else:
                body = b""
            self.writer.write(HEADER.pack(len(body), kind) + body)
        await self.writer.drain()

    async def close(self, timeout: float = 10.0) -> None:
        """After END, wait for the receiver's EOF (see serve_connection), then close."""
        await super().close(timeout)
        if self._credit_task is not None:
            if self.ended:
                try:
                    await asyncio.wait_for(asyncio.shield(self._credit_task), timeout)
                except asyncio.TimeoutError:
                    pass
            self._credit_task.cancel()
        if self.writer is not None:
            self.writer.close()
            try:
                await asyncio.wait_for(self.writer.wait_closed(), max(timeout, 1.0))
            except (ConnectionError, OSError, asyncio.TimeoutError):
                self.writer.transport.abort()     # the peer is gone or stuck: do not wait on it


def frame_buffer(size: int) -> memoryview:
    """A writable buffer for one large frame's body, from Arrow's memory pool when pyarrow is there.

    Why Arrow's pool: a fresh ``bytearray`` per frame was zeroed and page-faulted
    in afresh every time (megabytes per Arrow frame); the pool (jemalloc or
    mimalloc) hands back memory freed by earlier frames, already mapped, and
    does not zero it. Reuse is safe by Arrow's own ownership: the decoded
    batch's arrays hold the buffer (``decode`` opens it zero-copy), so its
    memory returns to the pool only when nothing references the frame any more.

    Only once pyarrow is imported (by the first Arrow batch decoded, or by the
    operators): importing it here, on the event loop at the first frame of
    64 KiB or more, took 100+ ms on a loaded machine inside the run, and was
    the p99 of bench/latency.py at 50 % of capacity (issue 34). A worker that
    never decodes an Arrow batch never needs the pool.
    """
    allocate = getattr(sys.modules.get("pyarrow"), "allocate_buffer", None)   # None while a thread imports it
    if allocate is None:                # not imported (yet): a plain buffer, no import on the loop
        return memoryview(bytearray(size))
    return memoryview(allocate(size)).cast("B")     # bytes (Arrow exports signed chars)


class FrameReceiver(asyncio.BufferedProtocol):
    """Receiver side of one TCP channel: frames into the PE's inbox, credits back.

    A buffered protocol parses frames straight out of the socket buffer, with
    no coroutine switch per frame (profiled: the StreamReader version spent
    about a quarter of the receiving worker in readexactly/feed_data). Data
    stays encoded in the inbox and is decoded by the PE when it takes the
    batch, inside its own time slice.

    Open handshake (see handshake.py): until the peer's HELLO proves the
    deployment's secret, only a HELLO of at most ``MAX_HELLO_BYTES`` is read;
    anything else, a wrong proof, or silence for ``HANDSHAKE_TIMEOUT_S`` closes
    the connection, and no receiver has been looked at but to find its secret.

    Close handshake: after END nothing more arrives, so our receive buffer is
    empty and closing sends FIN, not RST. The sender waits for that EOF before
    it closes; had it closed first with our credit frames unread, its kernel
    would reset the connection and ours would drop data not yet read.
    """

    CHUNK = 1 << 18
    BIG = 1 << 16               # frames at least this large are received into their own buffer
    # Until the peer is proven, a buffer just large enough for a HELLO: an unauthenticated
    # connection costs a few KiB, not CHUNK (issue 31: 255 KiB each, no cap on their number).
    UNPROVEN_CHUNK = 4 * (handshake.MAX_HELLO_BYTES + 8)

    def __init__(self, lookup: Callable[[str], tuple[Inbox, ChannelIn]], secret_of: Callable[[str], bytes],
                 expect: Callable[[str], Any] | None = None) -> None:
        self.lookup = lookup
        self.secret_of = secret_of          # channel id -> its deployment's secret (KeyError: none here)
        self.expect = expect                # channel id -> awaitable (inbox, receiver) once it exists
        self._parked: asyncio.Future | None = None
        self.nonce = handshake.new_nonce()
        self.limit = handshake.MAX_HELLO_BYTES      # largest frame accepted (any size once proven)
        self._on_frame = self._hello
        self._timeout: asyncio.TimerHandle | None = None
        self.chunk = self.UNPROVEN_CHUNK
        self.buf = bytearray(self.chunk)
        self._gated = False                 # counted by the handshake gate until proven or gone
        self.start = self.end = 0
        self.big: memoryview | None = None   # the large frame being received (frame_buffer), fill, kind
        self.big_filled = self.big_kind = 0
        self.inbox: Inbox | None = None
        self.receiver: ChannelIn | None = None
        self.transport: asyncio.Transport | None = None
        self._credits = 0                 # granted but not yet sent

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        if not handshake.gate().admit(transport.get_extra_info("peername")):
            transport.abort()
            return
        self._gated = True
        transport.write(HEADER.pack(len(self.nonce), CHALLENGE) + self.nonce)
        self._timeout = asyncio.get_running_loop().call_later(handshake.HANDSHAKE_TIMEOUT_S, self._too_late)

    def _too_late(self) -> None:
        self._refuse("no receiver for the channel came in time" if self._parked else "no HELLO in time")

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.big is not None:                        # a large frame's body: straight into its own buffer
            return self.big[self.big_filled:]
        if len(self.buf) < self.chunk:                  # proven: from the HELLO's size to CHUNK
            self.buf.extend(bytes(self.chunk - len(self.buf)))
        if len(self.buf) - self.end < self.chunk // 4:
            unread = self.end - self.start
            if self.start:                              # compact: move the unread tail to the front
                self.buf[:unread] = self.buf[self.start:self.end]
                self.start, self.end = 0, unread
            if len(self.buf) - self.end < self.chunk // 4:
                self.buf.extend(bytes(len(self.buf)))    # a frame larger than the buffer: grow
        return memoryview(self.buf)[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self.big is not None:
            self.big_filled += nbytes
            if self.big_filled < len(self.big):
                return
            body, kind = self.big, self.big_kind
            self.big = None
            self._on_frame(kind, body)
            return
        self.end += nbytes
        buf, size = self.buf, HEADER.size
        while self.end - self.start >= size and not self.transport.is_closing():
            length, kind = HEADER.unpack_from(buf, self.start)
            if length > self.limit:
                return self._refuse(f"a {length}-byte frame before the handshake")
            begin = self.start + size
            if self.end - begin < length:
                if length >= self.BIG:
                    # A large frame (an Arrow batch): the socket fills a buffer of its own,
                    # which becomes the payload as is: no copy out of ours, no growing ours.
                    have = self.end - begin
                    self.big = frame_buffer(length)
                    self.big[:have] = buf[begin:self.end]
                    self.big_filled, self.big_kind = have, kind
                    self.start = self.end = 0
                return
            body = bytes(buf[begin:begin + length])
            self.start = begin + length
            self._on_frame(kind, body)
        if self.start == self.end:
            self.start = self.end = 0

    def _hello(self, kind: int, body: bytes) -> None:
        """The first frame: a HELLO whose proof holds, or the connection is closed untouched.

        A proven HELLO for a receiver that is not here yet (a reconfiguration deploys a PE or
        adds an input while its senders already connect) waits for it (``expect``), within the
        handshake's time; the sender sends nothing before WELCOME, so nothing is buffered."""
        if kind != HELLO:
            return self._refuse(f"frame kind {kind} before HELLO")
        try:
            channel_id, client_nonce, proof = handshake.decode_hello(body)
            secret = self.secret_of(channel_id)
        except (ValueError, KeyError) as exc:
            return self._refuse(str(exc.args[0]) if exc.args else repr(exc))
        if not handshake.verify(handshake.client_proof(secret, self.nonce, client_nonce, channel_id), proof):
            return self._refuse(f"wrong proof for channel {channel_id!r}")
        self._ungate()                                  # proven: no longer the gate's to count
        welcome = handshake.server_proof(secret, self.nonce, client_nonce, channel_id)
        try:
            found = self.lookup(channel_id)
        except KeyError as exc:
            if self.expect is None:
                return self._refuse(str(exc.args[0]) if exc.args else repr(exc))
            self._on_frame = lambda kind, _body: self._refuse(f"frame kind {kind} before WELCOME")
            self._parked = asyncio.ensure_future(self.expect(channel_id))
            self._parked.add_done_callback(lambda done: self._unpark(done, welcome))
            return
        self._welcome(*found, welcome)

    def _unpark(self, done: asyncio.Future, welcome: bytes) -> None:
        self._parked = None
        error = None if done.cancelled() else done.exception()
        if self.transport.is_closing():
            return
        if done.cancelled() or error is not None:
            return self._refuse(f"no receiver came: {error!r}")
        self._welcome(*done.result(), welcome)

    def _welcome(self, inbox: Inbox, receiver: ChannelIn, welcome: bytes) -> None:
        self._timeout.cancel()
        self.inbox, self.receiver = inbox, receiver
        self.transport.write(HEADER.pack(len(welcome), WELCOME) + welcome)
        self.limit = 0xFFFFFFFF
        self.chunk = self.CHUNK                         # the buffer grows at the next read
        self.receiver.grant = self._grant
        self._on_frame = self._frame

    def _refuse(self, reason: str) -> None:
        """Close an unproven connection; nothing it sent has reached any receiver."""
        if not self.transport.is_closing():
            handshake.gate().refuse(self.transport.get_extra_info("peername"), reason)
            self.transport.abort()

    def _ungate(self) -> None:
        if self._gated:
            self._gated = False
            handshake.gate().done()

    def _frame(self, kind: int, body: bytes) -> None:
        """A frame from a proven peer. One that cannot be read is a dead letter naming the channel."""
        if kind == DATA:
            self.inbox.put(self.receiver, kind, body)
        elif kind == WATERMARK and len(body) == WM.size:
            self.inbox.put(self.receiver, kind, WM.unpack(body)[0])
        elif kind == MARKER:
            try:
                marker = handshake.decode_control(body)
            except Exception as exc:
                return self._malformed(kind, body, exc)
            self.inbox.put(self.receiver, kind, marker)
        elif kind == END:
            self.inbox.put(self.receiver, kind, body)
            if self.receiver.grant == self._grant:
                self.receiver.grant = lambda: None
            self.transport.close()
        else:
            self._malformed(kind, body, ValueError(f"unknown frame kind {kind} or bad length {len(body)}"))

    def _malformed(self, kind: int, body: bytes, exc: BaseException) -> None:
        self.inbox.put(self.receiver, MALFORMED, (bytes(body[:256]), f"frame kind {kind}, {len(body)} bytes: {exc!r}"))

    def _grant(self) -> None:
        """Return one credit; grants within one loop turn go back as one frame (one syscall)."""
        self._credits += 1
        if self._credits == 1:
            asyncio.get_running_loop().call_soon(self._send_credits)

    def _send_credits(self) -> None:
        if self._credits and not self.transport.is_closing():
            self.transport.write(HEADER.pack(COUNT.size, CREDIT) + COUNT.pack(self._credits))
        self._credits = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._ungate()
        if self._timeout is not None:
            self._timeout.cancel()
        if self._parked is not None:
            self._parked.cancel()
        if self.receiver is not None and self.receiver.grant == self._grant:
            self.receiver.grant = lambda: None     # the sender went away (its PE stopped)

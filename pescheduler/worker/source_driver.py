"""Driving a source: fixed-size batches, pacing to ``rate``, watermarks after each batch.

Kept apart from the asyncio PE loop so that ``pescheduler.testing`` and
``pescheduler.ep`` drive a source the same way a deployment does (and so
watermarks, which decide what is late, are the same in all three):
:class:`SourceDriver` reads, :func:`pump` moves one read into a chain. The
three callers differ only in how often they call :func:`pump` (the PE loop
once per turn, when the source is due; ``testing`` until the end; ``ep`` until
nothing is ready).
"""

from __future__ import annotations

from time import perf_counter

from typing import TYPE_CHECKING, Any, Callable

from ..operator import MIN_WATERMARK, DeadLetter, Source
from .gather import Gather

if TYPE_CHECKING:
    from .chain import Chain

SOURCE_POLL_S = 0.05     # how often a source that had nothing ready is asked again


class SourceDriver:
    """Reads batches from one source and tracks its watermark and pace."""

    def __init__(self, op_id: str, source: Source, batch_size: int, latency_s: float | None = None) -> None:
        """``latency_s``: the deployment's latency target (the PE spec's), which bounds how long a
        columnar source's ready reads are gathered (gather.py); None: ``pescheduler.batch.latency``."""
        self.op_id = op_id
        self.source = source
        self.batch_size = batch_size
        if source.rate:
            # At a low rate, ship about 10 ms of tuples at a time so latency stays low.
            self.batch_size = max(1, min(batch_size, int(source.rate / 100)))
        self.max_ts = MIN_WATERMARK
        self.emitted_wm = MIN_WATERMARK
        self.count = 0             # tuples emitted (the source's tuples_out)
        self.read_count = 0        # tuples read, dead letters included: what ``rate`` paces
        self.started: float | None = None    # the pace's start: the first read (not the PE's build)
        self.ended = False
        self.paused = False        # an alignment is in progress: read nothing (Sources.pause)
        self.rejected: list = []   # dead letters from the source (malformed input), for the chain
        self.own_watermark = type(source).watermark is not Source.watermark   # per-partition event time
        self.lag = source.lag if type(source).lag is not Source.lag else None
        if getattr(source, "columnar", False):
            # Arrow batches will come: load the kernels now, while the PE opens, not on the
            # first batch (importing pyarrow.compute takes 0.1-0.4 s, issue 16).
            import pyarrow.compute  # noqa: F401
        # Arrow reads ready at once go to the chain as one batch (gather.py); a paced source keeps its sizes.
        if latency_s is None:
            from .. import config

            latency_s = config.get_seconds("batch.latency")
        self.gather = Gather.within(lambda: self.source.read(self.batch_size), latency_s) \
            if getattr(source, "columnar", False) and not source.rate else None

    def drain(self) -> None:
        """End the source at the next read, as if exhausted (a graceful stop)."""
        self.source = _Exhausted(self.source)

    def take_rejected(self) -> list:
        """The source's dead letters since the last call (malformed input), for the chain."""
        taken, self.rejected = self.rejected, []
        return taken

    def snapshot(self) -> dict:
        """Position and watermark progress (the source's own offset is in its snapshot)."""
        return {"max_ts": self.max_ts, "emitted_wm": self.emitted_wm, "count": self.count,
                "read": self.read_count, "ended": self.ended,
                "elapsed": 0.0 if self.started is None else perf_counter() - self.started,
                **({"gather": self.gather.snapshot()} if self.gather is not None else {})}

    def restore(self, saved: dict | None) -> None:
        if saved:
            self.max_ts, self.emitted_wm, self.count = saved["max_ts"], saved["emitted_wm"], saved["count"]
            self.read_count = saved.get("read", self.count)
            self.ended = saved["ended"]
            self.started = perf_counter() - saved["elapsed"]    # keep to the rate across the move
            if self.gather is not None and "gather" in saved:
                self.gather.restore(saved["gather"])

    def read(self) -> list | None:
        """The next batch (maybe empty when nothing is ready), or None at the end."""
        if self.started is None:
            self.started = perf_counter()
        batch = self.gather.read() if self.gather is not None else self.source.read(self.batch_size)
        if "_rejected" in self.source.__dict__:
            self.rejected.extend(self.source.take_rejected())
        if batch is None:
            self.ended = True
            return None
        if batch:
            self.read_count += len(batch)
            if self.source.ts_field is not None and not self.own_watermark:
                batch = self._event_times(batch)
            self.count += len(batch)      # emitted: a dead letter is no output
        return batch

    def _event_times(self, batch):
        """The batch without events that have no valid time (dead letters now); the watermark's
        ``max_ts`` moved on by the valid ones."""
        stamp = self.source.event_time.stamp if isinstance(batch, list) else self.source.event_time.stamp_columns
        batch, bad, top = stamp(batch)
        self.rejected.extend(DeadLetter.of(t, reason) for t, reason in bad)
        if top is not None and top > self.max_ts:
            self.max_ts = top
        return batch

    def watermark(self) -> int | None:
        """The new watermark if the last batch advanced it (bounded out-of-orderness)."""
        if self.own_watermark:
            wm = self.source.watermark()
            if wm is None:
                return None
        elif self.source.ts_field is None or self.max_ts == MIN_WATERMARK:
            return None
        else:
            wm = self.max_ts - self.source.max_delay - 1
        if wm <= self.emitted_wm:
            return None
        self.emitted_wm = wm
        return wm

    def delay(self) -> float:
        """Seconds to wait before the next read so the source keeps to its ``rate``.

        The pace counts from the first read: counted from the driver's creation, the time
        the PE took to open its channels and start (tens of ms under load) put the
        first reads behind schedule, and they went as a burst (issue 34's 50 % p99)."""
        rate = self.source.rate
        if not rate or self.started is None:
            return 0.0
        return max(0.0, self.started + self.read_count / rate - perf_counter())


def pump(driver: SourceDriver, chain: "Chain") -> int | None:
    """One read of ``driver``'s source into ``chain``: rejected input dead-lettered, the batch
    emitted, the watermark advanced. Returns the tuples emitted (0: nothing ready now), or
    None when the source ended (the chain has been told). The read counts as the source's
    busy time (on the chain's clock)."""
    clock = chain.clock
    t0 = clock()
    batch = driver.read()
    node = chain.nodes.get(driver.op_id)
    if node is not None:
        node.stats.busy_s += clock() - t0          # source code is busy time
    if driver.rejected:
        chain.reject(driver.op_id, driver.take_rejected())
    if batch is None:
        chain.end_from(driver.op_id)
        return None
    if batch:
        chain.emit_from(driver.op_id, batch)
    wm = driver.watermark()
    if wm is not None:
        chain.watermark_from(driver.op_id, wm)
    return len(batch)


class Sources(list):
    """The source drivers of one PE (a list of :class:`SourceDriver`), and what the PE does with
    all of them at once: read those that are due, wait for the next one due, pause and resume
    them for an alignment, drain them, snapshot and restore them."""

    def __init__(self, ops: dict[str, Any], batch_size: int, latency_s: float | None = None) -> None:
        super().__init__(SourceDriver(op_id, op, batch_size, latency_s)
                         for op_id, op in ops.items() if isinstance(op, Source))

    def pump(self, chain: "Chain", held: Callable[[SourceDriver], bool]) -> bool:
        """One batch from every source that is due and not ``held`` back (flow.py); True if any moved."""
        progressed = False
        for driver in self:
            if driver.ended or driver.paused or driver.delay() > 0 or held(driver):
                continue
            if pump(driver, chain) != 0:      # a batch, or the end
                progressed = True
        return progressed

    def due_in(self, held: Callable[[SourceDriver], bool]) -> list[float]:
        """Seconds until each source that may read is due: a paced one's schedule, else its poll."""
        return [d.delay() or getattr(d.source, "poll_interval", None) or SOURCE_POLL_S for d in self
                if not (d.ended or d.paused or held(d))]

    def pause(self, paused: bool = True) -> None:
        """Read nothing (``paused``) or read on: an alignment holds the sources still."""
        for driver in self:
            driver.paused = paused

    def drain(self) -> bool:
        """End every live source at its next read (a graceful stop); False if none was live."""
        live = [d for d in self if not d.ended]
        for driver in live:
            driver.drain()
        return bool(live)

    def broker_backed(self) -> bool:
        """Does a source here leave its backlog at a broker (``backlog_elsewhere``: flow.py)?"""
        return any(getattr(d.source, "backlog_elsewhere", False) for d in self)

    def snapshot(self) -> dict[str, dict]:
        return {d.op_id: d.snapshot() for d in self}

    def restore(self, restore: dict[str, dict]) -> None:
        """Each driver's progress from a checkpoint's (or a moved instance's) saved entry."""
        for driver in self:
            if driver.op_id in restore:
                driver.restore(restore[driver.op_id]["driver"])


class _Exhausted:
    """Stands in for a drained source: reads nothing more, so the PE ends it."""

    def __init__(self, source: Source) -> None:
        self.ts_field, self.max_delay, self.rate = source.ts_field, source.max_delay, None
        self.event_time = source.event_time

    def read(self, n: int) -> None:
        return None

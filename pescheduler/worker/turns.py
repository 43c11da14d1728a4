"""Where a PE's turns of work run: on the worker's event loop, or in a thread of its own.

Measured on this kind of machine, a saturated PE on the event loop still let
the worker answer control calls in 1.2 ms p50 / 3.1 ms p99; in a dedicated
thread the GIL pushed that to 6.7 / 81 ms. So a PE starts on the loop and
moves to a thread only when a turn shows an operator blocks or runs long
(see :meth:`Turns.run`). Kept apart from the PE loop (runtime.py), which
decides *what* a turn does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from ..state.foreground import FOREGROUND
from .busy import busy_clock

THREAD_AFTER_S = 0.1     # a turn this long means an operator blocks or runs long: give the PE a thread
BACK_AFTER_S = 10.0      # a PE sent to a thread by one long turn comes back to the loop after this long
                         # of short turns; twice as long each time it comes back (Turns.run)
YIELDS = 16              # at most this many loop passes after a long turn while the loop has other work
LONG_TURN_S = 0.002      # a turn at least this long on the loop: the loop runs until nothing is ready after it


def thread_after(time_slice_s: float) -> float:
    """The turn (busy seconds) that sends a PE with this time slice to a thread of its own: twice
    the slice, and at least :data:`THREAD_AFTER_S` (:meth:`Turns.run`; flow.slice_size takes a
    batch that long whole, so the turn shows it)."""
    return max(2 * time_slice_s, THREAD_AFTER_S)


async def let_the_loop_run(passes: int = YIELDS) -> None:
    """Let the event loop run until it has nothing else ready, at most ``passes`` passes.

    A control call or a channel's handshake is a chain of callbacks, each scheduled by the one
    before (a read wakes a reader, which wakes a handler, which writes): with one pass between
    two turns of a hot PE, each link of the chain waited for a whole turn (at least one batch:
    20 ms at 20 us a tuple). A copy's connect to the PE's worker took four of them, 80 ms of a
    warm activation's 100, and every call waited two. With nothing else ready this is one pass.
    ``_ready`` is asyncio's own run queue (CPython's loop; another loop: one pass).
    """
    await asyncio.sleep(0)
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    for _ in range(passes - 1):
        if not ready:
            return
        await asyncio.sleep(0)


def _counted(work: Callable[[], bool]) -> bool:
    """One turn, on the loop or in the PE's thread, counted while it runs: the state's background
    work (a checkpoint's writer) gives way meanwhile (``state/foreground.py``)."""
    with FOREGROUND.turn():
        return work()


class Turns:
    """Runs one PE's turns, one at a time and in order, on the loop or in its thread."""

    def __init__(self, name: str, time_slice_s: float, spare_thread: ThreadPoolExecutor | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.name = name
        # What a turn is timed on: busy_clock, or (a PE) the busy time its operators have counted so
        # far on it, which costs no system call (busy.py: two reads a turn were 7% of a worker).
        self.clock = clock
        self.time_slice_s = time_slice_s
        self.spare_thread = spare_thread           # a standard slot's warm thread (copies)
        self.thread: ThreadPoolExecutor | None = None    # set when operators block or run long
        self.threaded_because = ""
        # Set while the thread is for a long turn (not for an operator that may block, which stays
        # threaded): when its turns were last long, and the short stretch that brings it back.
        self._long_at: float | None = None
        self._back_after = BACK_AFTER_S
        self._inflight: Future | None = None
        self.long_turn = False                      # the last turn held the loop LONG_TURN_S or more
        # Held by a turn in the thread and by the control calls that change the chain, its routes
        # or channels (pehost: pe_reconf, pe_rewire, pe_snapshot), so they run between turns. Without
        # it a rewire switched routes while the thread emitted: a batch on the new route overtook the
        # held batches replayed ahead of it (issue 20: per-key order and keyed sums broke under CPU
        # load, when 10 ms turns stretch past THREAD_AFTER_S and PEs go threaded).
        self.lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._handing = threading.Lock()            # guards _handed: the PE's thread adds, the loop takes
        self._handed: list[Callable[[], None]] = []     # calls from the thread waiting for the loop, in order

    def bind(self) -> None:
        """Remember the running event loop: :meth:`on_loop` hands work back to it."""
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()

    async def run(self, work: Callable[[], bool]) -> bool:
        """One turn of ``work``: on the event loop, or in this PE's thread once a turn ran long.

        A turn longer than twice the time slice (and than ``THREAD_AFTER_S``)
        means an operator blocks or runs long. The turn is timed on the busy clock
        (busy.py): blocking counts, waiting for a CPU does not, so a quick turn
        preempted on a loaded machine does not send the PE to a thread (a source
        went threaded at load 28). From then on the PE works in its own thread (order kept:
        one thread, one turn at a time) so the worker's event loop keeps
        answering heartbeats and control calls. Anything that touches loop
        objects (credit grants, events) is handed to the loop thread-safely.
        """
        if self.thread is None:
            clock = self.clock or busy_clock
            t0 = clock()
            progressed = _counted(work)
            took = clock() - t0
            self.long_turn = took >= LONG_TURN_S
            if took > thread_after(self.time_slice_s):
                self.go_threaded(f"a turn took {took * 1000:.0f} ms")
                self._long_at = time.monotonic()
        else:
            clock = self.clock or busy_clock
            async with self.lock:
                t0 = clock()
                self._inflight = self.thread.submit(_counted, work)
                progressed = await asyncio.wrap_future(self._inflight)
                self._inflight = None
                took = clock() - t0
            self.long_turn = False              # the loop was free meanwhile
            if self._long_at is not None:
                self._back_if_short(took)
        return progressed

    def _back_if_short(self, took: float) -> None:
        """After a turn in the thread that a long turn gave the PE: back to the loop once every
        turn for :attr:`_back_after` seconds was short (under half of what sends a PE to a thread).
        One long turn (a rescale's import, a store's flush under load) otherwise kept a PE off the
        loop for good, its turns sharing the GIL with the loop that feeds them: at 10^7 keys a
        checkpoint took twice as long and stalled the stream longer (docs/state-log.md, session
        66). Each return doubles the stretch, so an operator that does run long now and then
        blocks the loop a bounded number of times."""
        now = time.monotonic()
        if took > thread_after(self.time_slice_s) / 2:
            self._long_at = now
        elif now - self._long_at >= self._back_after:
            if self.thread is not self.spare_thread:
                self.thread.shutdown(wait=False)
            self.thread, self._long_at = None, None
            self.threaded_because = ""
            self._back_after *= 2

    async def between(self) -> None:
        """Between two turns: one pass of the event loop, or after a long turn on it until nothing
        else is ready (:func:`let_the_loop_run`). Short turns keep one pass: two PEs of a worker
        would otherwise pass the loop to each other up to YIELDS times between turns of microseconds."""
        await let_the_loop_run(YIELDS if self.long_turn else 1)

    def go_threaded(self, because: str) -> None:
        """Work in this PE's own thread from now on (``because`` is shown in its status)."""
        if self.thread is None:
            self.threaded_because = because
            self.thread = self.spare_thread or ThreadPoolExecutor(1, thread_name_prefix=f"pe-{self.name}")

    async def off_loop(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` between turns, in this PE's thread once it has one (else here, on the loop).

        For the control calls that reach operators and may wait on an external
        system, such as a sink's commit retrying a full disk or a broker: in the
        thread they leave the worker's loop free for heartbeats. The caller holds
        :attr:`lock`, so no turn runs meanwhile and no further input reaches the
        operators before ``fn`` returned (their order and exactly-once hold).
        """
        if self.thread is None:
            return fn()
        self._inflight = self.thread.submit(fn)
        try:
            return await asyncio.wrap_future(self._inflight)
        finally:
            self._inflight = None

    def on_loop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the event loop: now if called there, else scheduled thread-safely, in order.

        From the thread, calls that come while an earlier one still waits for the loop go with it
        (one ``call_soon_threadsafe``, not one each): each wakes the loop through a socket write,
        which lets the GIL go, and beside a thread running Python (a checkpoint's writer) the PE's
        thread got it back only up to a switch interval (5 ms) later, once per batch (its credit)."""
        if self._loop is None or threading.get_ident() == self._loop_thread:
            fn()
            return
        with self._handing:
            self._handed.append(fn)
            if len(self._handed) > 1:
                return                          # the call scheduled for the first takes it along
        self._loop.call_soon_threadsafe(self._run_handed)

    def _run_handed(self) -> None:
        with self._handing:
            fns, self._handed = self._handed, []
        for fn in fns:
            try:
                fn()
            except Exception as exc:            # as the loop does with a callback's: logged, the rest go on
                self._loop.call_exception_handler({"message": f"PE {self.name}: a call handed to the loop failed",
                                                   "exception": exc})

    def close(self) -> None:
        """Wait for a turn still running in the thread (never close operators under it), then
        let the thread go."""
        if self._inflight is not None and not self._inflight.done():
            self._inflight.result()
        if self.thread is not None:
            self.thread.shutdown(wait=False)

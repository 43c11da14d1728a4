"""The PEs' turns first: a worker's background state work gives way to them between its slices.

**Why.** A checkpoint's writer runs Python in a thread of the worker beside the PE whose state it
writes, and the two share the GIL: the switch interval (``pe.switch-interval``, 0.5 ms) hands it
from one to the other, so a PE's turn beside the writer ran at about half speed. Traced at 10^7
keys on ``memory`` (perf with the scheduler's switches, session 57): in the gaps of 20-40 ms
between outputs inside checkpoints, the PE's thread was off the CPU in ``take_gil`` most of the
gap while the writer's thread ran (lookups of the changed keys, pickling, the interval's keys
let go); outside checkpoints the same turns left gaps of 5-8 ms.

The worker's event loop waited for the GIL the same way (it takes the PE's input off the sockets
and hands it to the PE's thread), so its work counts as a turn too: from each return of its
selector's ``select`` to its next call (:meth:`Foreground.count_loop`).

**What.** A PE's turn is counted while it runs (:meth:`Foreground.turn`, ``worker/turns.py``);
the checkpoint's writer works in :meth:`Foreground.background` (``worker/ckpt_files.py``) and,
between two slices of its work (a key group, a slice of keys, a chunk of 1,024 pairs of a ``disk``
group it reads and packs whole: :func:`give_way`), waits while any turn runs, so its work goes in
the time the PEs leave. Three bounds:

- it waits at most as long as its own last stretch of work took (and at most :data:`MOST_S`):
  it keeps at least half of the time it had, so a checkpoint beside a PE that is never idle
  takes at most about twice as long, and never starves;
- only a thread in :meth:`Foreground.background` waits: the same slices read in a PE's turn or
  on the worker's event loop go on at once;
- ``pe.writer-gives-way`` false (set at a worker's start, ``worker/process_settings.py``) turns
  it off.

**Its CPU too.** A thread can wait for a CPU, not the GIL: at 10^7 keys on ``memory`` the stops
of 50-140 ms at some checkpoints' starts (session 58: the system's switches and wake-ups traced
with the workers' stacks) were the worker's event loop *runnable* and not run for 74 ms. The
kernel preempted it on one core, where the upstream worker's loop and PE thread woke each other
hundreds of times, while the writer ran on the other core; the PE's thread meanwhile waited on its
empty input queue. The loop is not counted while it is in ``select`` (nor while it waits for a
CPU on its way out of it), so nothing waited. Now a writer that met no turn lets its CPU go
anyway: after :data:`PAUSE_EVERY_S` of work since it last slept it sleeps :data:`PAUSE_S` at its
next slice's end: a core gone idle is one the scheduler can give a thread waiting on the other
(not traced yet on this code). It costs the
writer at most a ninth of its time (a full checkpoint of 10^6 keys in process: 218 pauses, 4 %).
Tried and not kept: the writer's thread at ``nice`` 10, and a ``give_way`` per slice of
``memory``'s deferred fold (``_Fold.apply``, which holds the fold's lock): with either, the first
checkpoint after a rescale missed its 30 s timeout in both rows (one row in nine without). Session
59 traced that miss to a checkpoint writing the whole state beside the moves, which a slower
writer makes likelier, not to a wait under the lock; a ``give_way`` in the fold every 256 keys,
re-measured then (three ways, docs/state-log.md "The steady checkpoints' gaps of 15-22 ms"), made no
gap smaller and is not in the code.

A turn that begins while the writer is in a slice still shares the GIL with it until that slice
ends: a key group or :data:`~pescheduler.state.incremental.SLICE_KEYS` keys (a steady checkpoint
at 10^7 keys: 250-300 ms of the writer's CPU over 128 groups, about 2 ms a group). A ``disk``
group written whole (a steady checkpoint at 10^7 keys writes two or three, 78 k keys and about
100 ms of the writer's work each) gives way at each chunk it reads out of the store and packs:
beside it a turn of 0.2 ms took at most 0.4-0.6 ms, against 1.1-3.9 ms when the group was one
slice (in process, session 66).

Measured (bench/state.py's 10^7 ``memory`` row, on and off in turn, docs/state-log.md "A checkpoint's
writer gives way to the PEs' turns"): steady checkpoints with a gap over 20 ms 6 of 50 against
30 of 71, the largest gap 21.2-26.4 ms a row against 20.3-131.7 (five and seven rows). Stops of
50-140 ms at checkpoints' starts came in some rows with it or without: not this sharing (above).
With the pauses, nine rows against nine in turn (session 58, "The stops at checkpoints' starts:
the event loop waiting for a CPU"): steady checkpoints over 45 ms in no row against 11 in four
rows; over 20 ms 15 of 90 against 23; as long as before.
"""

from __future__ import annotations

import threading
import time

MOST_S = 0.02       # the longest a writer waits at one point (two PE time slices)
PAUSE_EVERY_S = 0.004   # background work between two pauses of a writer that met no turn...
PAUSE_S = 0.0005        # ...each this long: its CPU free for a thread the scheduler left waiting


class Foreground:
    """The turns running in this process, and the waits of the work that gives way to them."""

    def __init__(self) -> None:
        self.enabled = True
        self._cond = threading.Condition(threading.Lock())
        self._running = 0           # turns running now (several PEs of one worker may each run one)
        self._waiting = 0           # threads in give_way's wait: an ending turn wakes them
        self._local = threading.local()     # per thread: background or not; when its stretch began
        self.waited_s = 0.0         # what give_way waited for turns in all (the tests read it)
        self.paused_s, self.pauses = 0.0, 0     # ...and slept to let its CPU go (PAUSE_S each)

    def turn(self) -> "_Turn":
        """A context manager around one PE turn: counted while it runs."""
        return _Turn(self)

    def background(self) -> "_Background":
        """A context manager around background work in this thread: its :meth:`give_way` calls
        wait for the turns."""
        return _Background(self._local)

    def count_loop(self, loop) -> bool:
        """Count ``loop``'s work (on its thread: this call is) as a turn, from each return of its
        selector's ``select`` to its next call; False where the loop has no selector of asyncio's
        (another loop: not counted), or it is counted already."""
        selector = getattr(loop, "_selector", None)
        if selector is None or type(selector) is _CountingSelector:
            return False
        loop._selector = _CountingSelector(selector, self)
        self._begin()                   # the loop is at work now: this call runs on it
        return True

    def give_way(self) -> None:
        """Between two slices of work: in :meth:`background`, wait while a turn runs, at most as
        long as this thread worked since its last call (and :data:`MOST_S`); else, after
        :data:`PAUSE_EVERY_S` of work since it last let its CPU go, sleep :data:`PAUSE_S`;
        elsewhere nothing."""
        local = self._local
        if not getattr(local, "background", False):
            return
        now = time.perf_counter()
        if self.enabled and self._running:
            with self._cond:
                self._waiting += 1
                try:
                    self._cond.wait_for(lambda: not self._running, timeout=min(now - local.since, MOST_S))
                finally:
                    self._waiting -= 1
            after = time.perf_counter()
            self.waited_s += after - now
            if after - now >= PAUSE_S:      # it slept: its CPU was free meanwhile
                local.paused = after
            now = after
        elif self.enabled and now - local.paused >= PAUSE_EVERY_S:
            time.sleep(PAUSE_S)
            after = time.perf_counter()
            self.paused_s += after - now
            self.pauses += 1
            now = local.paused = after
        local.since = now

    def _begin(self) -> None:
        with self._cond:
            self._running += 1

    def _end(self) -> None:
        with self._cond:
            self._running -= 1
            if not self._running and self._waiting:
                self._cond.notify_all()


class _Turn:
    __slots__ = ("fg",)

    def __init__(self, fg: Foreground) -> None:
        self.fg = fg

    def __enter__(self) -> None:
        self.fg._begin()

    def __exit__(self, *exc) -> None:
        self.fg._end()


class _CountingSelector:
    """An event loop's selector whose ``select`` is the loop's idle time: its caller's turn ends
    before it and begins again after it; everything else is the selector's own."""

    def __init__(self, selector, fg: Foreground) -> None:
        self._selector, self._fg = selector, fg

    def select(self, timeout=None):
        self._fg._end()
        try:
            return self._selector.select(timeout)
        finally:
            self._fg._begin()

    def close(self) -> None:
        """The loop closes (from its thread, at work): its count ends with it."""
        self._fg._end()
        self._selector.close()

    def __getattr__(self, name: str):
        return getattr(self._selector, name)


class _Background:
    __slots__ = ("local", "was")

    def __init__(self, local: threading.local) -> None:
        self.local = local

    def __enter__(self) -> None:
        self.was = getattr(self.local, "background", False)
        self.local.background = True
        self.local.since = self.local.paused = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.local.background = self.was


FOREGROUND = Foreground()       # the process's: worker/turns.py counts turns, the state's writers give way
give_way = FOREGROUND.give_way

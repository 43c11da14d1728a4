"""What a worker process sets for its PEs beside large state: the GIL's switch interval (and whether
a checkpoint's writer gives way to the PEs' turns: ``state/foreground.py``), a
cyclic garbage collector that does not visit the state at every full collection, and (on jemalloc,
``pescheduler/allocator.py``) its purging threads.

**The switch interval.** A thread that lets the GIL go for a system call (a socket write that
wakes the event loop, the loop's ``select``) gets it back, beside a thread running Python, only
when that one is made to yield: CPython's switch interval later, 5 ms by default. A threaded PE
hands the loop every turn, and the loop hands it the next: beside a checkpoint's writer each
hand-over waited up to 5 ms, and its outputs stalled 125-151 ms at 10^7 keys (bench/state.py's
table, the largest gaps after the collector's). At ``pe.switch-interval`` = 0.5 ms: 58-64 ms.

**The collector.** A full (generation-2) collection visits every container the process tracks,
and the ``memory`` backend's index and key-group dicts hold every key: 81 ms at 10^6 keys, 233 ms
at 4 * 10^6, and 1.5-1.7 s at 10^7 in a worker, holding the GIL (every PE of the worker stopped).
So after each full collection the survivors are frozen (``gc.freeze``: a generation no collection
visits; reference counting still frees whatever it can), and a full collection visits what came
since the last one, whatever the state's size.

What freezing gives up: a reference cycle among frozen objects that becomes garbage later is
found only once they are thawed. The cycles that matter come from a stopped PE (its operators,
chain, channels), so a PE's stop thaws (:func:`thaw`); and once every ``pe.gc-thaw-every`` (10
minutes) the next full collection visits everything, once, for a long run's other cycles: a
pause of the old size then (1.5 s at 10^7 keys), where without the freeze one came each time the
objects promoted since the last grew by a quarter (every ~2 minutes at 10^7 keys and 1 % of them
changed per 5 s).
"""

from __future__ import annotations

import gc
import sys
import time

from .. import allocator, config
from ..state.foreground import FOREGROUND


class _FreezeAfterFull:
    """The ``gc.callbacks`` entry: after a full collection, freeze its survivors, or (thaw due)
    leave them for the next full collection to visit."""

    def __init__(self, thaw_every_s: float) -> None:
        self.thaw_every_s = thaw_every_s
        self.thawed_at = time.monotonic()

    def __call__(self, phase: str, info: dict) -> None:
        if phase != "stop" or info.get("generation") != 2:
            return
        if gc.get_freeze_count() and time.monotonic() - self.thawed_at >= self.thaw_every_s:
            thaw()                              # the next full collection visits everything, once
            self.thawed_at = time.monotonic()
        else:
            gc.freeze()


_installed: _FreezeAfterFull | None = None


def apply() -> None:
    """Set this process up as its ``pe`` settings say (a worker's PE host, at its start); again
    is a no-op."""
    global _installed
    sys.setswitchinterval(config.get_seconds("pe.switch-interval"))
    FOREGROUND.enabled = bool(config.get("pe.writer-gives-way"))   # state/foreground.py
    allocator.start_background_threads()     # jemalloc's purging off the PE's threads (pescheduler/allocator.py)
    if _installed is None and config.get("pe.gc-freeze"):
        _installed = _FreezeAfterFull(config.get_seconds("pe.gc-thaw-every"))
        gc.callbacks.append(_installed)


def freeze_survivors() -> None:
    """Everything the process tracks now frozen, where it freezes survivors: called right after key
    groups were imported (a rescale's part, a restored group), and after a memory window's panes
    were packed for a checkpoint with the collector paused (``operators/pane_layers.py``: the
    slots the fold copied meanwhile, 10^5 at 10^6 keys, were all young at once, and the first
    collection after visited them: 27 ms). An import makes a container or more per key, millions
    at 10^7 keys, which the next young collections and the next full one would each visit,
    holding the GIL: traced after a Release at 10^7 on ``memory``, 61 ms, 28-50 ms and 199 ms.
    ``gc.freeze`` is O(1) (it moves the generations' lists whole); what it gives up is what
    freezing after a full collection gives up, and the same thaws find it."""
    if _installed is not None:
        gc.freeze()


def thaw() -> None:
    """Everything frozen goes back to the oldest generation: the next full collection visits it
    (a PE stopped: its cycles are garbage now)."""
    if gc.get_freeze_count():
        gc.unfreeze()

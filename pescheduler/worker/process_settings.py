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

**The collector** (``pescheduler/collector.py``, ``pe.gc-freeze``): what survives a full
collection is frozen, so that no collection visits the state again and again.
"""

from __future__ import annotations

import sys

from .. import allocator, collector, config
from ..state.foreground import FOREGROUND


def apply() -> None:
    """Set this process up as its ``pe`` settings say (a worker's PE host, at its start); again
    is a no-op."""
    sys.setswitchinterval(config.get_seconds("pe.switch-interval"))
    FOREGROUND.enabled = bool(config.get("pe.writer-gives-way"))   # state/foreground.py
    allocator.start_background_threads()     # jemalloc's purging off the PE's threads (pescheduler/allocator.py)
    if config.get("pe.gc-freeze"):
        collector.install(config.get_seconds("pe.gc-thaw-every"))

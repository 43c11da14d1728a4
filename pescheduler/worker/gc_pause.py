"""The cyclic GC paused around one batch of allocation-heavy work, and what a thread makes to keep
frozen.

A batch's decode and emit, and a restored key group's unpickle and import,
allocate a container or more per tuple or key, all acyclic: each 700 of them
ran a generation-0 collection, and the full ones visit every object the
worker holds (at 10^6 keys on ``memory``, 0.3-0.6 s holding the GIL).
Paused, what the batch made is counted by the next collection after it.

The collector's switch is the process's, not a thread's: a pause ending in one thread turns it on
for all. So a long job in a thread whose result lives on (a rescale's part or a lazily restored
group made ready for the store, hundreds of milliseconds) is not paused: paused, what it made so far
was visited whole by the first collection after any PE batch's pause ended meanwhile (10-48 ms at a
time in the PE's turn at 10^7 keys on ``disk``, traced), and by the first after its own end. It runs
with the collector on (young collections of what came since the last, a few hundred objects each)
and what it made is frozen when it is done (:func:`frozen_after`).
"""

from __future__ import annotations

import gc
from typing import Any, Callable

from ..collector import freeze_survivors


def gc_paused(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with the cyclic GC paused; left paused when a caller further up paused it."""
    if not gc.isenabled():
        return fn(*args)
    gc.disable()
    try:
        return fn(*args)
    finally:
        gc.enable()


def frozen_after(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, then what the process made meanwhile frozen
    (:func:`~pescheduler.collector.freeze_survivors`, where the process freezes survivors): for work
    whose result lives on. A rescale's part and a lazily restored group made ready for the store in
    a thread, until a turn installs them, run with the collector on (the young collections meanwhile
    each visit what came since the last) and are frozen when done, so that no generation-1 or full
    collection visits them again. Before, paused and not frozen, the first collection after (in that
    thread, at the future's ``set_result``) visited them all holding the GIL: 40-95 ms after each
    part of a Replicate and of a Release at 10^7 keys on ``disk`` (traced; 9 ms per group of 78,000
    keys in process). Inside :func:`gc_paused` (a memory window's view read for a checkpoint,
    ``operators/pane_layers.py``: what the fold copied and the PE made meanwhile, whose first
    collection after took 27 ms at 10^6 keys), it freezes before the collector goes on again: after,
    the PE's thread could take the GIL and collect first."""
    made = fn(*args)
    freeze_survivors()
    return made

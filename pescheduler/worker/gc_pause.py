"""The cyclic GC paused around one batch of allocation-heavy work, and held off while a thread makes
what will live on.

A batch's decode and emit, and a restored key group's unpickle and import,
allocate a container or more per tuple or key, all acyclic: each 700 of them
ran a generation-0 collection, and the full ones visit every object the
worker holds (at 10^6 keys on ``memory``, 0.3-0.6 s holding the GIL).
Paused, what the batch made is counted by the next collection after it.

The collector's switch is the process's, not a thread's: a batch's pause ending turns it on for
every thread. A long job in a thread, making what will live on (a rescale's part or a lazily
restored group made ready for the store: hundreds of milliseconds at 10^7 keys), had its pause ended
so by the PE's batches meanwhile, and the next collection, in the PE's turn, visited what it had made
so far: 10-48 ms at a time while a Release's groups came back at 10^7 keys on ``disk`` (traced).
Unpaused, collections during it visit its growing lists again and again: a row had 106
collections over 10 ms while the groups moved, up to 67 ms. So such a job holds the collector off
(:func:`gc_held`): no batch's pause ending turns it on until the job is done, and what the job made
is frozen then. A batch's pause stays the toggle it was: two threads' batches
overlapping (a threaded PE's and its loop's decode) would otherwise keep the collector off for long
stretches, and a collection after visit all that came meanwhile.
"""

from __future__ import annotations

import gc
import threading
from typing import Any, Callable

from ..collector import freeze_survivors

_HELD = threading.Lock()
_held = [0]          # jobs holding the collector off (gc_held), in any thread


def gc_paused(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with the cyclic GC paused; left paused when a caller further up paused it, or
    while a job holds it off (:func:`gc_held`; read without the lock: a job that began in between
    has the collector on until the next batch's pause begins, as every job had before)."""
    if not gc.isenabled():
        return fn(*args)
    gc.disable()
    try:
        return fn(*args)
    finally:
        if not _held[0]:
            gc.enable()


def gc_held(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with the collector off for the whole process until it is done, then what it made
    frozen (:func:`~pescheduler.collector.freeze_survivors`) before the collector goes on: for a job
    that makes what will live on. A rescale's part and a lazily restored group made ready for the
    store in a thread: not frozen, the first collection after (at the future's ``set_result``)
    visited them all holding the GIL, 40-95 ms after each part of a Replicate and of a Release at
    10^7 keys on ``disk`` (traced; 9 ms per group of 78,000 keys in process), then a generation-1
    collection and a full one again. A memory window's view read for a checkpoint
    (``operators/pane_layers.py``): what the fold copied and the PE made meanwhile, whose first
    collection after took 27 ms at 10^6 keys. The collector goes on again when the last such job is
    done (a worker's collector is on: nothing else keeps it off)."""
    with _HELD:
        _held[0] += 1
        gc.disable()
    try:
        return _frozen_after(fn, *args)
    finally:
        with _HELD:
            _held[0] -= 1
            if not _held[0]:
                gc.enable()


def _frozen_after(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, then what the process made meanwhile frozen
    (:func:`~pescheduler.collector.freeze_survivors`, where the process freezes survivors), before
    the collector goes on again: after, another thread could take the GIL and collect first."""
    made = fn(*args)
    freeze_survivors()
    return made

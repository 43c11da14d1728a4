"""The cyclic GC paused around one batch of allocation-heavy work.

A batch's decode and emit, and a restored key group's unpickle and import,
allocate a container or more per tuple or key, all acyclic: each 700 of them
ran a generation-0 collection, and the full ones visit every object the
worker holds (at 10^6 keys on ``memory``, 0.3-0.6 s holding the GIL).
Paused, what the batch made is counted by the next collection after it.
"""

from __future__ import annotations

import gc
import threading
from typing import Any, Callable

from ..collector import freeze_survivors


_PAUSES = threading.Lock()
_paused = [0, False]        # pauses going on in the process's threads; whether the collector was on before them


def gc_paused(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with the cyclic GC paused. The collector's switch is the process's, not a
    thread's: it goes on again only when no thread's pause is going on. A PE's batch (a short
    pause) ending in the middle of a long one in another thread (a rescale's part made ready)
    turned it on, and the next collection, in the PE's turn, visited what the long one had made so
    far: 10-48 ms at a time while a Release's groups came back at 10^7 keys on ``disk`` (traced).
    The collector left off by someone else stays off."""
    with _PAUSES:
        if not _paused[0]:
            _paused[1] = gc.isenabled()
            gc.disable()
        _paused[0] += 1
    try:
        return fn(*args)
    finally:
        with _PAUSES:
            _paused[0] -= 1
            if not _paused[0] and _paused[1]:
                gc.enable()


def gc_paused_kept(fn: Callable[..., Any], *args: Any) -> Any:
    """:func:`gc_paused`, and what the process made meanwhile frozen before the collector goes on
    again (:func:`~pescheduler.collector.freeze_survivors`, where the process freezes survivors;
    frozen after, the PE's thread could take the GIL and collect first): for work whose result
    lives on. A rescale's part and a lazily restored group made ready for the store in a thread,
    until a turn installs them: left young, the first collection after, in that thread at the
    future's ``set_result``, visited them all holding the GIL, 40-95 ms after each part of a
    Replicate and of a Release at 10^7 keys on ``disk`` (traced; 9 ms per group of 78,000 keys in
    process); then a generation-1 collection and a full one again. A memory window's view read
    for a checkpoint (``operators/pane_layers.py``): what the fold copied and the PE made
    meanwhile, 27 ms at 10^6 keys."""
    return gc_paused(_then_frozen, fn, *args)


def _then_frozen(fn: Callable[..., Any], *args: Any) -> Any:
    made = fn(*args)
    freeze_survivors()
    return made

"""The cyclic GC paused around one batch of allocation-heavy work.

A batch's decode and emit, and a restored key group's unpickle and import,
allocate a container or more per tuple or key, all acyclic: each 700 of them
ran a generation-0 collection, and the full ones visit every object the
worker holds (at 10^6 keys on ``memory``, 0.3-0.6 s holding the GIL).
Paused, what the batch made is counted by the next collection after it.
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


def gc_paused_kept(fn: Callable[..., Any], *args: Any) -> Any:
    """:func:`gc_paused`, and what ``fn`` made frozen before the collector resumes
    (:func:`~pescheduler.collector.freeze_survivors`, where the process freezes survivors): for
    work in a thread whose result lives on until a turn installs it (a rescale's part, a lazily
    restored group, made ready for the store). Left young, all of it was visited by the first
    collection after, in that thread at the future's ``set_result``, holding the GIL: 40-95 ms
    after each part of a Replicate and of a Release at 10^7 keys on ``disk`` (traced), 9 ms per
    group of 78,000 keys in process; then again by a generation-1 collection and a full one."""
    return gc_paused(_then_frozen, fn, *args)


def _then_frozen(fn: Callable[..., Any], *args: Any) -> Any:
    made = fn(*args)
    freeze_survivors()
    return made

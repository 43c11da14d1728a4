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


def gc_paused(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with the cyclic GC paused; left paused when a caller further up paused it."""
    if not gc.isenabled():
        return fn(*args)
    gc.disable()
    try:
        return fn(*args)
    finally:
        gc.enable()

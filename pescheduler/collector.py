"""The cyclic collector of a worker process beside large state: what survives is frozen, so that no
collection visits the state again and again.

**Why.** A full (generation-2) collection visits every container the process tracks, and the
``memory`` backend's index and key-group dicts hold every key: 81 ms at 10^6 keys, 233 ms at
4 * 10^6, and 1.5-1.7 s at 10^7 in a worker, holding the GIL (every PE of the worker stopped). So
after each full collection the survivors are frozen (``gc.freeze``: a generation no collection
visits; reference counting still frees whatever it can), and a full collection visits what came
since the last one, whatever the state's size (:class:`_FreezeAfterFull`, installed by a worker's
``worker/process_settings.py`` where ``pe.gc-freeze`` is on).

Young collections visit every entry of every young container the same way. Where a process makes
many containers at once that will live on (a rescale's imported groups, a restored group, a memory
window's packed panes, a ``memory`` snapshot's new dicts of the keys written since), it freezes
them at once (:func:`freeze_survivors`).

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
import time


class _FreezeAfterFull:
    """The ``gc.callbacks`` entry: after a full collection, freeze its survivors, or (thaw due)
    leave them for the next full collection to visit."""

    def __init__(self, thaw_every_s: float) -> None:
        self.thaw_every_s = thaw_every_s
        self.thawed_at = time.monotonic()

    def __call__(self, phase: str, info: dict) -> None:
        if phase != "stop" or info.get("generation") != 2:
            return
        if _frozen and time.monotonic() - self.thawed_at >= self.thaw_every_s:
            thaw()                              # the next full collection visits everything, once
            self.thawed_at = time.monotonic()
        else:
            _freeze()


_installed: _FreezeAfterFull | None = None
_frozen = False     # frozen here since the last thaw: ``gc.get_freeze_count`` would walk every frozen object


def _freeze() -> None:
    global _frozen
    gc.freeze()
    _frozen = True


def install(thaw_every_s: float) -> None:
    """This process freezes what survives each full collection, thawed every ``thaw_every_s``;
    again is a no-op."""
    global _installed
    if _installed is None:
        _installed = _FreezeAfterFull(thaw_every_s)
        gc.callbacks.append(_installed)


def freeze_survivors() -> None:
    """Everything the process tracks now frozen, where it freezes survivors: called right after key
    groups were imported (a rescale's part, a restored group), when a thread has made them ready for
    the store (``worker/gc_pause.py`` ``gc_held``), after a memory window's panes
    were packed for a checkpoint with the collector paused (``operators/pane_layers.py``: the
    slots the fold copied meanwhile, 10^5 at 10^6 keys, were all young at once, and the first
    collection after visited them: 27 ms), and at a ``memory`` snapshot (``state/memory.py``: its
    new dicts of the keys written since, young while they grew, met by a generation-1 collection
    at 21,769-58,152 entries each once per checkpoint interval at 10^7 keys: 5-23 ms). An import
    makes a container or more per key, millions at 10^7 keys, which the next young collections and
    the next full one would each visit, holding the GIL: traced after a Release at 10^7 on
    ``memory``, 61 ms, 28-50 ms and 199 ms. ``gc.freeze`` is O(1) (it moves the generations' lists
    whole); what it gives up is what freezing after a full collection gives up, and the same thaws
    find it."""
    if _installed is not None:
        _freeze()


def thaw() -> None:
    """Everything frozen goes back to the oldest generation: the next full collection visits it
    (a PE stopped: its cycles are garbage now). ``gc.unfreeze`` is O(1), as ``gc.freeze``; not so
    ``gc.get_freeze_count``, which walks every frozen object: asked first here, it took 13 ms at
    10^6 frozen objects and 145 ms at 10^7 (in process), in the stop of a Move's or a Release's
    retired PE, in the pause, and after each full collection."""
    global _frozen
    gc.unfreeze()
    _frozen = False

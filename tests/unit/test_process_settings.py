"""A worker's process settings (worker/process_settings.py): the GIL's switch interval, and a
collector (pescheduler/collector.py) that freezes what survived a full collection, thawed when a PE stops or on a period."""

from __future__ import annotations

import gc
import sys
import time
import weakref

import dask.config
import pytest

from pescheduler.worker import process_settings
from pescheduler import collector as collector_module
from pescheduler.collector import _FreezeAfterFull
from growth import assert_grows_less


@pytest.fixture
def collector():
    """A callback of its own in gc.callbacks for the test, the process's collector as it was after."""
    added: list = []
    collector_module.thaw()         # through the module: it knows what it froze (gc.get_freeze_count walks it all)

    def install(thaw_every_s: float) -> _FreezeAfterFull:
        callback = _FreezeAfterFull(thaw_every_s)
        gc.callbacks.append(callback)
        added.append(callback)
        return callback
    yield install
    for callback in added:
        gc.callbacks.remove(callback)
    collector_module.thaw()


class _Node:
    def __init__(self) -> None:
        self.other = None


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_full_collection_freezes_what_survived_it_so_the_next_does_not_visit_it(collector):
    """Large state (the memory backend's dicts of every key) survives every full collection: frozen
    after the first, the next ones do not visit it (1.5-1.7 s at 10^7 keys in a worker)."""
    collector(thaw_every_s=3600)
    state = {i: {"v": i} for i in range(1_000_000)}
    gc.collect()
    assert gc.get_freeze_count() > 0
    started = time.process_time()
    gc.collect()
    frozen_visit = time.process_time() - started
    collector_module.thaw()
    started = time.process_time()
    gc.collect()                                # visits the state (and freezes it again)
    whole_visit = time.process_time() - started
    assert frozen_visit < whole_visit, (frozen_visit, whole_visit)
    del state


def test_a_cycle_frozen_alive_is_found_once_thawed(collector):
    """What freezing gives up, and how it is given back: a cycle that was alive at a full
    collection and became garbage after it is found only after a thaw (a PE's stop thaws)."""
    collector(thaw_every_s=3600)
    keep = _cycle()
    strong = keep()
    gc.collect()                                # alive: frozen
    del strong
    gc.collect()
    assert keep() is not None                   # garbage, but frozen
    collector_module.thaw()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert keep() is None


def test_every_thaw_period_the_full_collection_after_the_next_visits_everything(collector):
    """``pe.gc-thaw-every``: the cycles of a long run that no PE's stop thaws are found too."""
    collector(thaw_every_s=0.0)
    keep = _cycle()
    strong = keep()
    gc.collect()                                # the first: frozen
    assert gc.get_freeze_count() > 0
    del strong
    gc.collect()                                # due: thawed after it, not frozen
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert keep() is None


def test_apply_sets_the_switch_interval_from_the_settings():
    before = sys.getswitchinterval()
    try:
        with dask.config.set({"pescheduler.pe.switch-interval": "2ms", "pescheduler.pe.gc-freeze": False}):
            process_settings.apply()
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)


class _Keyed:
    """An instance that imports exported key groups (as ``latest`` does): rows in a dict."""

    def __init__(self) -> None:
        self.rows: dict = {}

    def import_groups(self, state: dict) -> None:
        self.rows.update(state)


@pytest.mark.parametrize("freezing", [True, False])
def test_key_groups_imported_by_a_rescale_are_frozen_where_the_worker_freezes(monkeypatch, freezing):
    """A rescale's import (``handover.import_groups``) freezes what the process holds, its new rows
    with it: no young or full collection visits them (10^4 rows here; 5 * 10^6 after a Release at
    10^7, traced: 61 ms, 28-50 ms and 199 ms of collections). Where the worker does not freeze
    (``pe.gc-freeze`` off), nothing is frozen."""
    from pescheduler.worker.handover import import_groups

    monkeypatch.setattr(collector_module, "_installed", _FreezeAfterFull(600) if freezing else None)
    collector_module.thaw()
    op, rows = _Keyed(), {f"k{i}": {"v": i} for i in range(10_000)}
    try:
        import_groups(op, rows)
        del rows
        if freezing:
            assert gc.get_freeze_count() >= 10_000, f"{gc.get_freeze_count()} objects frozen after the import"
        else:
            assert gc.get_freeze_count() == 0
    finally:
        collector_module.thaw()


def test_a_thaw_does_not_walk_what_is_frozen(freezing):
    """A PE's stop thaws (``pehost.pe_stop``: in the pause of a Move, and of a Release in its
    retired copy's hand-over call) and so does a full collection when the thaw is due: in a time
    that does not grow with what is frozen. Asking ``gc.get_freeze_count`` first walked every
    frozen object: 1 ms at 10^5, 13 ms at 10^6 in process (x10); 10^7 and more at 10^7 keys."""
    def measure(n: int) -> list[float]:
        held, took = [[i] for i in range(n)], []
        for _ in range(3):
            collector_module.freeze_survivors()
            t = time.thread_time()
            collector_module.thaw()
            took.append((time.thread_time() - t) * 1000)
            assert gc.get_freeze_count() == 0
        del held
        return took
    assert_grows_less(measure, "a thaw", keys=100_000, floor_ms=1.0)

"""A disk store's close is not its caller's: rocksdict flushes the memtable before it closes (no
option skips it; with the WAL off RocksDB flushes on drop too), 0.4 s for 5 * 10^5 keys quiet and
seconds loaded, and the caller is whoever drops the last reference to the state, often the garbage
collector in a PE's turn or in a reconfiguration's pause on the worker's loop (a Release's retired
copy). The close and the directory's removal run in a thread of their own (state/disk.py ``_shut``)."""

from __future__ import annotations

import gc
import os
import threading
import weakref

import dask.config

from pescheduler.state import disk, open_state

BOUND_S = 60.0          # a closer thread that has not finished by then is a failure, whatever the load


class _Store:
    """The state's RocksDB store, noting the thread that closes it."""

    def __init__(self, db) -> None:
        self.db, self.closed_on, self.closed = db, None, threading.Event()

    def close(self) -> None:
        self.closed_on = threading.current_thread()
        self.db.close()
        self.closed.set()


def _filled(root: str):
    """A disk state with keys in its memtable, its store wrapped in a :class:`_Store`."""
    with dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": "64MB"}):
        state = open_state("disk", owner="close")
    state.write_many((f"car-{i:07d}", [i, i, i, i]) for i in range(20_000))
    state.groups()                          # the write-back buffer into the memtable
    store = _Store(state._db)
    state._end.detach()                     # the state's finalizer, on the wrapped store
    state._end = weakref.finalize(state, disk._shut, store, state.path)
    return state, store


def _closed_elsewhere(store: _Store, path: str) -> None:
    assert store.closed.wait(BOUND_S), "the store was not closed"
    assert store.closed_on is not threading.current_thread(), \
        f"the store was closed in its caller's thread ({store.closed_on.name}): the flush was the caller's"
    store.closed_on.join(BOUND_S)
    assert not store.closed_on.is_alive() and not os.path.exists(path), os.listdir(path)


def test_a_closed_store_flushes_and_goes_in_a_thread_of_its_own(tmp_path):
    state, store = _filled(str(tmp_path))
    path = state.path
    state.close()
    _closed_elsewhere(store, path)


def test_a_garbage_collected_store_flushes_and_goes_in_a_thread_of_its_own(tmp_path):
    state, store = _filled(str(tmp_path))
    path = state.path
    state._views.append(state.snapshot())   # a cycle (state -> view -> state): the collector ends it
    del state
    gc.collect()
    _closed_elsewhere(store, path)

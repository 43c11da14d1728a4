"""Fixtures for tests of keyed state on both backends in one process: the worker's directory
(stores, local copies of checkpoint files) in the test's own, and a fresh state per backend.

A test module takes them with ``from keyed_stores import state, worker_dir  # noqa: F401``."""

from __future__ import annotations

import dask
import pytest

from pescheduler.state import open_state
from pescheduler.state.incremental import (load_snapshot, load_state_file, pack_delta, resolve_restore, unpack_delta,
                                          with_entries)


def restored_state(store, checkpoint_id: int) -> dict:
    """Operator ``op``'s state as a worker restores it from checkpoint ``checkpoint_id`` of a
    ``CheckpointStore``: the ``.state`` file's references read back and checked against the manifest."""
    manifest = store.manifest(checkpoint_id)
    entry = next(e for e in manifest["files"] if e["role"] == "state")
    blob = load_state_file(store.read(entry, store.run))
    groups = with_entries(blob["groups"], manifest["files"], lambda e: store.read(e, store.run))
    saved = {"op": {**load_snapshot(blob["ops"], groups)["op"], "storage": store.storage}}
    resolve_restore(saved)
    return saved["op"]["state"]


@pytest.fixture(autouse=True)
def worker_dir(tmp_path):
    """The worker's directory (stores, local copies of checkpoint files) in the test's own."""
    with dask.config.set({"pescheduler.state.dir": str(tmp_path / "worker")}):
        yield tmp_path / "worker"


@pytest.fixture(params=["memory", "disk"])
def state(request, tmp_path):
    """A fresh keyed state of each backend, with a small cache (a disk store's reads reach RocksDB)."""
    with dask.config.set({"pescheduler.state.dir": str(tmp_path / "stores"), "pescheduler.state.cache": "8MB"}):
        st = open_state(request.param, owner="test")
    yield st
    st.close()


@pytest.fixture
def unpacked(monkeypatch):
    """Every key-group file in its PE's segment (``state.files.Segment``), none held in its PE's
    ``.state`` (``incremental._Pack``): the layout of groups past ``PACK_DELTA`` bytes (10^6 keys
    and more), which tests that count or damage a group's files look at."""
    from pescheduler.state import incremental

    monkeypatch.setattr(incremental, "PACK_DELTA", -1)


@pytest.fixture
def disk_stores(tmp_path):
    """A maker of disk stores by owner name in the test's directory (64 MB of cache), closed after it."""
    opened = []

    def make(name: str):
        with dask.config.set({"pescheduler.state.dir": str(tmp_path), "pescheduler.state.cache": "64MB"}):
            opened.append(open_state("disk", owner=name))
        return opened[-1]
    yield make
    for state in opened:
        state.close()


def filled_mixed(state, keys: int) -> dict:
    """``keys`` keys of mixed kinds (ints, strs, tuples) in the store, then writes still in the
    write-back buffer (puts over stored keys, new keys, deletes of stored keys), so that a view
    holds both; the model of what the state holds."""
    model = {(i if i % 3 else (f"car-{i:07d}" if i % 2 else ("t", i))): {"v": i, "lane": i % 4} for i in range(keys)}
    state.write_many(model)
    state._flush()
    later = {k: {"v": -1} for k in list(model)[::97]}
    later.update({keys + j: {"v": j} for j in range(50)})
    gone = list(model)[5::89]
    state.write_many(later, gone)
    assert state._pending, "some writes must still be in the buffer"
    model.update(later)
    for k in gone:
        model.pop(k)
    return model


def written_delta(view, group: int, keys) -> tuple[dict, list]:
    """``view.delta`` as a checkpoint writes it and a restore reads it back: ``({key: value} put,
    [key] deleted)``, unpickled (a disk view's values are the store's pickles until then)."""
    return unpack_delta(pack_delta(*view.delta(group, keys)))


class CountedSteps:
    """A store iterator whose ``next`` calls are counted (a Python loop's steps)."""

    def __init__(self, it, steps: list) -> None:
        self.it, self.steps = it, steps

    def next(self):
        self.steps.append(1)
        return self.it.next()

    def __getattr__(self, name):
        return getattr(self.it, name)


class StepCountingStore:
    """A store whose iterators count their steps."""

    def __init__(self, db) -> None:
        self.db, self.steps = db, []

    def iter(self, *args, **kwargs):
        return CountedSteps(self.db.iter(*args, **kwargs), self.steps)

    def __getattr__(self, name):
        return getattr(self.db, name)

"""Fixtures for tests of keyed state on both backends in one process: the worker's directory
(stores, local copies of checkpoint files) in the test's own, and a fresh state per backend.

A test module takes them with ``from keyed_stores import state, worker_dir  # noqa: F401``."""

from __future__ import annotations

import dask
import pytest

from pescheduler.state import open_state


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
    """Every key-group file a file of its own, none held in its PE's ``.state`` (``incremental._Pack``):
    the layout of groups past ``PACK_DELTA`` bytes (10^6 keys and more), which tests that count
    or damage a group's files by name look at."""
    from pescheduler.state import incremental

    monkeypatch.setattr(incremental, "PACK_DELTA", -1)

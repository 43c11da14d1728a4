"""A ``disk`` store made ahead (``state/settings.py``'s ``Spares``): the next store a worker opens for
the deployment is taken, not created, so a Move's pause (its PE built anew in it) holds no RocksDB
creation (5-45 ms of fsyncs with the GIL held, traced in session 77)."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import dask.config
import pytest
import rocksdict

from pescheduler.state.settings import OWNER, SPARES, deployment_dir, open_state, remove_stores
from pescheduler.worker.pehost import PEHost


@pytest.fixture
def state_dir(tmp_path):
    with dask.config.set({"pescheduler.state.dir": str(tmp_path), "pescheduler.state.cache": "8MB"}):
        yield tmp_path


def _created(monkeypatch) -> list[str]:
    """The paths of every RocksDB opened from now on (rocksdict's ``Rdict``, as DiskState imports it)."""
    opened, real = [], rocksdict.Rdict

    def counted(path, *args, **kwargs):
        opened.append(path)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(rocksdict, "Rdict", counted)
    return opened


def test_the_next_store_opened_is_the_one_made_ahead_and_no_store_is_created_then(state_dir, monkeypatch):
    SPARES.make_ahead("spare-a", delay=0)
    try:
        assert SPARES.wait("spare-a", 30), "no store made ahead"
        opened = _created(monkeypatch)
        state = open_state("disk", "pe-window-c0-state", "spare-a")
        assert opened[:1] == [], opened                      # taken, not created
        assert os.path.basename(state.path).startswith("spare-")
        with open(os.path.join(state.path, OWNER)) as f:
            assert f.read() == "pe-window-c0-state"
        state.put("car-7", 3)
        assert state.get("car-7") == 3
        assert SPARES.wait("spare-a", 30)                    # the next one made after the take (no delay here: 1 s)
        state.close()
    finally:
        remove_stores("spare-a")


def test_without_one_ready_a_store_is_created_and_one_made_at_another_budget_is_not_taken(state_dir, monkeypatch):
    opened = _created(monkeypatch)
    fresh = open_state("disk", "op", "spare-b")              # no make_ahead: created now, named by its owner
    assert len(opened) == 1 and os.path.basename(fresh.path).startswith("op-")
    SPARES.make_ahead("spare-b", delay=0)
    try:
        assert SPARES.wait("spare-b", 30)
        with dask.config.set({"pescheduler.state.cache": "16MB"}):
            other = open_state("disk", "op", "spare-b")
        assert os.path.basename(other.path).startswith("op-") and len(opened) == 3   # the spare's, then this one
        fresh.close()
        other.close()
    finally:
        remove_stores("spare-b")


def test_a_deployment_that_ends_closes_and_removes_its_store_made_ahead_and_stops_the_next(state_dir):
    SPARES.make_ahead("spare-c", delay=0)
    assert SPARES.wait("spare-c", 30)
    [spare] = [d for d in os.listdir(deployment_dir("spare-c")) if d.startswith("spare-")]
    remove_stores("spare-c")
    assert not os.path.exists(os.path.join(deployment_dir("spare-c"), spare))
    SPARES.make_ahead("spare-c", delay=3600)                # dropped before its timer fires: none comes
    remove_stores("spare-c")
    assert not SPARES.wait("spare-c", 0.1)
    assert open_state("memory", "op", "spare-c").backend == "memory"


def test_a_disk_deployment_that_comes_to_a_worker_gets_a_store_made_ahead_there(state_dir):
    async def scenario():
        host = PEHost(SimpleNamespace(address="tcp://127.0.0.1:1", handlers={}))
        host.pe_secret("spare-d", b"secret", state="disk")
        host.pe_secret("spare-e", b"secret", state="memory")
        ready = await asyncio.to_thread(SPARES.wait, "spare-d", 30)
        assert ready and not SPARES.wait("spare-e", 0)
        assert await host.pe_stop("spare-d") == []           # the deployment over here: its store made ahead goes
        assert not os.path.exists(deployment_dir("spare-d"))

    asyncio.run(scenario())

"""A retired PE's disk store (issue 30: the Release pause on disk). rocksdict's ``close`` flushes
the memtable, and a store is closed wherever its last reference goes: for a stopped PE's state
(its views and it refer to each other) at a full collection of the cyclic GC, in whatever turn of
whatever loop runs then (190-235 ms for 5 * 10^5 keys). A stopped PE's stores are emptied and
flushed by RocksDB's own background thread right after the stop, so that close writes nothing.
Asserted on what the store holds, not on times."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import cloudpickle
import dask.config
import pytest
from tests.waiting import until_async
from support_ops import Collect

from pescheduler.state import key_group, open_state
from pescheduler.worker import handshake
from pescheduler.worker.channels import DATA
from pescheduler.worker.pehost import PEHost
from pescheduler.wire import InputSpec, PESpec

from operators.latest import Latest

DEP = "dep-retire"
IN = f"{DEP}/0/src.out->pe"
BOUND = 20.0                       # seconds: every wait here is bounded by this (a loaded machine)
KEYS = 6000                        # more than a write-back buffer (FLUSH_KEYS): the memtable holds keys


def _memtable_entries(state) -> int:
    db = state._db
    return (db.property_int_value("rocksdb.num-entries-active-mem-table")
            + db.property_int_value("rocksdb.num-entries-imm-mem-tables"))


def _flushed(state) -> bool:
    db = state._db
    return not (db.property_int_value("rocksdb.num-immutable-mem-table")
                or db.property_int_value("rocksdb.mem-table-flush-pending"))


def _until(predicate, what: str):
    """Yield to the loop until ``predicate()``, bounded by BOUND: the PEs run on this very loop."""
    return until_async(predicate, BOUND, what)


@pytest.fixture(autouse=True)
def worker_dir(tmp_path):
    with dask.config.set({"pescheduler.state.dir": str(tmp_path / "worker"), "pescheduler.state.cache": "64MB"}):
        yield


def test_a_stopped_pes_disk_store_is_left_with_nothing_for_its_close_to_flush():
    """A PE host stops a PE whose ``latest`` keeps its rows on disk (a reconfiguration's ``stop``
    step): right after, its store's memtable is flushed, with every group dropped, in RocksDB's
    background thread, so its close later writes nothing."""
    async def scenario():
        host = PEHost(SimpleNamespace(address="tcp://127.0.0.1:retire", handlers={}, ip="127.0.0.1"))
        await host.start()
        host.pe_secret(DEP, handshake.new_secret(), state="disk")
        try:
            spec = PESpec("pe", DEP, {"state": (Latest, {"key": "id"}, "id"), "sink": (Collect, {}, None)},
                          [("src", "out", "state"), ("state", "out", "sink")], inputs=[InputSpec(IN, "src", "out")])
            await host.pe_deploy(cloudpickle.dumps([spec]), start=True)
            pe = host.pes[(DEP, "pe")]
            pe.ports.inbox.put(pe.ports.receivers[IN], DATA,
                               [{"op": "update", "id": f"car-{i:07d}", "after": {"v": i}} for i in range(KEYS)])
            sunk = pe.ops["sink"].items
            await _until(lambda: len(sunk) == KEYS or pe.state != "running", "every update out")
            assert pe.state == "running", pe.error
            rows = pe.ops["state"]._rows
            assert rows.backend == "disk" and _memtable_entries(rows) >= KEYS // 2, "the keys are in the memtable"
            assert await host.pe_stop(DEP, ["pe"]) == ["pe"]
            left = lambda: _memtable_entries(rows) + len(rows._pending)
            await _until(lambda: _flushed(rows) and left() == 0,
                         f"the stopped PE's store emptied (it holds {left()} writes in its memtable and buffer: "
                         f"its close, wherever the GC frees it, flushes them holding the GIL)")
        finally:
            await host.close()
    asyncio.run(scenario())


def test_views_taken_before_a_store_is_retired_still_read_what_they_saw(tmp_path):
    """A deferred move's groups are packed after the pause (after the stop): the take's view, and a
    checkpoint's view not read yet, still read every key once the store is retired."""
    state = open_state("disk", owner="retired")
    try:
        rows = {f"car-{i:07d}": {"v": i} for i in range(KEYS)}
        state.write_many(rows.items())
        moving = sorted({key_group(k) for k in rows})[::2]
        taken = state.take_groups(moving)
        view = state.snapshot()                 # a checkpoint's barrier, its write not begun
        state.retire()
        assert dict(kv for g in moving for kv in taken[g].items()) == {k: v for k, v in rows.items()
                                                                      if key_group(k) in moving}
        assert dict(kv for g in view.groups() for kv in view.items(g)) == {k: v for k, v in rows.items()
                                                                          if key_group(k) not in moving}
        view.release()
        assert state.groups() == []
    finally:
        state.close()

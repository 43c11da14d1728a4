"""The table's raw-loop baseline (bench/benchops.py ``latest_in_rocksdb``) does the work it stands for.

bench/state.py's table and bench/fill.py compare the ``disk`` backend's fill with this loop: the
binding's own writes into a store opened as ``disk`` opens it. A baseline that skipped part of the
work (or wrote what ``disk`` could not read) would flatter the backend's ratio to it, so: its
outputs are ``latest``'s for the same batches, and its store holds the rows as ``disk`` stores them.
"""

import importlib.util
import os

from pescheduler.operator import Emitter, OperatorContext
from pescheduler.operators import Latest
from pescheduler.state.disk import DiskState

# Loaded by path: bench/ on sys.path would let its kafka.py shadow the Kafka client for every later test.
_SPEC = importlib.util.spec_from_file_location(
    "benchops", os.path.join(os.path.dirname(__file__), "..", "..", "bench", "benchops.py"))
benchops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(benchops)


def _opened(op, tmp_path, monkeypatch):
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path))
    op.open(OperatorContext(op.name, pe_id="pe", key_field="id", extra={"state": "disk"}))
    return op


def test_the_raw_loop_emits_what_latest_emits_and_its_store_reads_back_as_disk(tmp_path, monkeypatch):
    fill = [{"op": "insert", "id": i, "after": {"v": i}} for i in range(300)]
    updates = [{"op": "update", "id": i, "after": {"v": -i}} for i in range(0, 300, 7)]
    outs = []
    for op in (_opened(Latest(), tmp_path, monkeypatch), _opened(benchops.LatestInRocksDB(), tmp_path, monkeypatch)):
        emitted = Emitter()
        op.process(fill, emitted)
        op.process(updates, emitted)
        outs.append(list(emitted))
    assert outs[0] == outs[1] and len(outs[1]) == 343
    assert [o["previous"] for o in outs[1][300:]] == [{"v": i} for i in range(0, 300, 7)]   # an update reads its row
    raw = op._state
    assert type(raw) is DiskState and op.held() == 300                 # the store disk opens, each key once
    # rows pickled, keys encoded as disk's: the backend's own scan decodes them (group by group)
    assert dict(raw.entries()) == {i: {"v": -i if i % 7 == 0 else i} for i in range(300)}

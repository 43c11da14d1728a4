"""Two-phase-commit file sinks: pre_commit / commit / abort and crashes give exactly-once files.

A crash here is what a killed worker leaves: the sink object is dropped without
``flush`` (its descriptors closed, nothing published), and a *new* instance is
restored from the snapshot of the last complete checkpoint, opened and told
``commit(id)`` of that checkpoint, as the coordinator does; the stream replays
from that checkpoint's position.
"""

import json
import os

import dask.config
import pyarrow.dataset as ds
import pytest
import tmpfs
from hypothesis import given, settings
from hypothesis import strategies as st

from pescheduler.errors import DeliveryFailed
from pescheduler.operator import OperatorContext
from pescheduler.operators.sinks import JsonlSink, ParquetSink

ITEMS = [{"n": i, "ts": i} for i in range(120)]


def jsonl_rows(path):
    text = open(path).read() if os.path.exists(path) else ""
    return [json.loads(line)["n"] for line in text.splitlines()]


def parquet_rows(path):
    if not os.path.isdir(path):
        return []
    table = ds.dataset(path, format="parquet").to_table()
    return sorted(table.column("n").to_pylist()) if table.num_rows else []


SINKS = {
    "jsonl": (lambda d: JsonlSink(path=str(d / "out.jsonl")), lambda d: jsonl_rows(d / "out.jsonl")),
    "parquet": (lambda d: ParquetSink(path=str(d / "table"), rows=4), lambda d: parquet_rows(d / "table")),
}


def opened(sink, state=None, checkpoint=True):
    if state is not None:
        sink.restore(state)
    sink.open(OperatorContext(f"{sink.name}-1", extra={"checkpoint": checkpoint}))
    return sink


def restored(sink, state, checkpoint_id):
    """Recovery from ``checkpoint_id`` as the coordinator does it (worker/barriers.py)."""
    opened(sink, state)
    sink.commit(checkpoint_id)
    sink.abort(checkpoint_id + 1)
    return sink


@pytest.mark.parametrize("kind", SINKS)
def test_abort_drops_what_was_staged_for_that_checkpoint_and_after(tmp_path, kind):
    make, rows = SINKS[kind]
    sink = opened(make(tmp_path))
    sink.process(ITEMS[:8], None)
    sink.pre_commit(1)
    sink.process(ITEMS[8:12], None)
    sink.pre_commit(2)
    sink.process(ITEMS[12:16], None)                     # since the last barrier
    sink.abort(2)
    sink.commit(2)
    assert rows(tmp_path) == list(range(8))
    sink.process(ITEMS[8:20], None)                      # the replay
    sink.flush(None)
    assert rows(tmp_path) == list(range(20))
    sink.close()


def crash(sink):
    """A killed process: descriptors gone, nothing flushed or published."""
    sink.close()


@pytest.mark.parametrize("kind", SINKS)
def test_output_is_visible_only_once_its_checkpoint_commits(tmp_path, kind):
    make, rows = SINKS[kind]
    sink = opened(make(tmp_path))
    sink.process(ITEMS[:10], None)
    sink.pre_commit(1)
    sink.process(ITEMS[10:20], None)
    assert rows(tmp_path) == [], "output before its checkpoint completed is visible"
    sink.commit(1)
    assert rows(tmp_path) == list(range(10))
    sink.commit(1)                                       # idempotent
    sink.pre_commit(2)                                   # checkpoint 2 fails, the job goes on: no call,
    sink.process(ITEMS[20:30], None)                     # what it staged goes with the next commit
    sink.pre_commit(3)
    sink.commit(3)
    assert rows(tmp_path) == list(range(30))
    sink.process(ITEMS[30:35], None)
    sink.flush(None)                                     # end of stream: the last checkpoint
    assert rows(tmp_path) == list(range(35))
    sink.close()


@pytest.mark.parametrize("kind", SINKS)
def test_a_restored_sink_drops_what_came_after_its_checkpoint_and_commits_it_once(tmp_path, kind):
    make, rows = SINKS[kind]
    sink = opened(make(tmp_path))
    sink.process(ITEMS[:10], None)
    sink.pre_commit(1)
    saved = json.loads(json.dumps(sink.snapshot()))      # checkpoint 1 (state survives JSON)
    sink.process(ITEMS[10:17], None)                     # after the barrier: replayed after the crash
    sink.pre_commit(2)                                   # checkpoint 2 never completes
    sink.process(ITEMS[17:19], None)
    crash(sink)                                          # ... before commit(1) ran
    again = restored(make(tmp_path), saved, 1)
    assert rows(tmp_path) == list(range(10))
    again.process(ITEMS[10:25], None)                    # the replay from checkpoint 1's position
    again.pre_commit(2)
    again.commit(2)
    assert rows(tmp_path) == list(range(25))
    crash(again)                                         # after commit(2) ran: restore is idempotent
    third = restored(make(tmp_path), saved, 1)
    assert rows(tmp_path) == list(range(10)), "restoring checkpoint 1 keeps exactly its output"
    third.process(ITEMS[10:], None)
    third.flush(None)
    assert rows(tmp_path) == list(range(len(ITEMS)))
    third.close()


def test_jsonl_a_commit_torn_by_a_crash_is_cut_back_and_done_once(tmp_path):
    sink = opened(JsonlSink(path=str(tmp_path / "out.jsonl")))
    sink.process(ITEMS[:8], None)
    sink.pre_commit(1)
    saved = sink.snapshot()
    with open(tmp_path / "out.jsonl", "a") as f:         # commit(1) got half-way: a torn append
        f.write('{"n":0,"ts":0}\n{"n":1,')
    crash(sink)
    again = restored(JsonlSink(path=str(tmp_path / "out.jsonl")), saved, 1)
    assert jsonl_rows(tmp_path / "out.jsonl") == list(range(8))
    again.close()


@pytest.mark.parametrize("kind", SINKS)
def test_without_checkpoints_the_sinks_write_straight_through(tmp_path, kind):
    make, rows = SINKS[kind]
    sink = opened(make(tmp_path), checkpoint=False)
    sink.process(ITEMS[:8], None)
    assert kind == "parquet" or rows(tmp_path) == list(range(8))     # parquet: full files only
    sink.flush(None)
    assert rows(tmp_path) == list(range(8))
    assert not any(p.name.startswith(".") for p in tmp_path.rglob("*")), "staging left behind"
    sink.close()


# -- random interleavings of batches, barriers, completions, aborts and crashes --------------

STEP = st.sampled_from(["batch", "batch", "batch", "barrier", "complete", "abort", "crash", "torn"])


@pytest.mark.parametrize("kind", SINKS)
@settings(max_examples=40, deadline=None)
@given(steps=st.lists(STEP, max_size=40), sizes=st.lists(st.integers(1, 9), min_size=40, max_size=40))
def test_any_interleaving_with_crashes_writes_every_item_exactly_once(tmp_path_factory, kind, steps, sizes):
    make, rows = SINKS[kind]
    folder = tmp_path_factory.mktemp(kind)
    sink, pos, next_id = opened(make(folder)), 0, 1
    pending: dict[int, tuple] = {}             # barrier passed, not complete: id -> (position, state)
    complete = None                            # the last complete checkpoint: (id, position, state)
    for step, size in zip(steps, sizes):
        if step == "batch" and pos < len(ITEMS):
            sink.process(ITEMS[pos:pos + size], None)
            pos = min(pos + size, len(ITEMS))
        elif step == "barrier":
            sink.pre_commit(next_id)
            pending[next_id] = (pos, json.loads(json.dumps(sink.snapshot())))
            next_id += 1
        elif step in ("complete", "torn") and pending:
            cid = min(pending)
            complete = (cid, *pending.pop(cid))
            if step == "torn":                 # the crash comes before (or amid) commit(cid)
                if kind == "jsonl":
                    with open(folder / "out.jsonl", "a") as f:
                        f.write('{"n":')
                step = "crash"
            else:
                sink.commit(cid)
        elif step == "abort" and pending:          # a checkpoint fails, the job goes on: no call
            pending.pop(max(pending))
        if step == "crash":
            crash(sink)
            pending.clear()
            if complete is None:
                sink, pos = opened(make(folder)), 0
            else:
                sink, pos = restored(make(folder), complete[2], complete[0]), complete[1]
        visible = rows(folder)
        if kind == "jsonl":
            assert visible == list(range(len(visible))), "visible output is not a clean prefix"
        assert len(visible) <= (complete[1] if complete else 0), "output visible before its checkpoint"
        if step == "crash":
            assert visible == list(range(complete[1] if complete else 0)), "recovered output is not the checkpoint's"
    sink.process(ITEMS[pos:], None)
    sink.flush(None)
    sink.close()
    assert rows(folder) == list(range(len(ITEMS)))


# -- a real full disk (a small tmpfs, tests/tmpfs.py): nothing forgotten, nothing torn ---------

FAST_RETRIES = {"pescheduler.sinks.retry.backoff": "1ms", "pescheduler.sinks.retry.max-backoff": "1ms"}
PADDED = [{"n": i, "pad": "x" * 200} for i in range(200)]        # about 45 KiB of lines


@pytest.fixture
def small_disk():
    with tmpfs.mounted(1 << 20) as folder:
        yield folder


def test_jsonl_a_commit_on_a_full_disk_forgets_nothing_and_publishes_once_room_is_back(small_disk):
    path = os.path.join(small_disk, "out.jsonl")
    sink = opened(JsonlSink(path=path))
    sink.process(PADDED, None)
    sink.pre_commit(1)
    filler = tmpfs.fill(small_disk, leave=8192)       # the append fits only in part: a torn line
    with dask.config.set(FAST_RETRIES), pytest.raises(Exception, match="No space left"):
        sink.commit(1)
    assert os.path.getsize(path) == 0, "a torn append was left in the file"
    os.remove(filler)
    sink.commit(1)                                    # called again: finishes the job
    sink.commit(1)                                    # and once more: nothing twice
    assert jsonl_rows(path) == list(range(200))
    sink.close()


def test_jsonl_a_write_on_a_full_disk_fails_the_pe_without_a_torn_line(small_disk):
    path = os.path.join(small_disk, "out.jsonl")
    sink = opened(JsonlSink(path=path), checkpoint=False)
    sink.process(PADDED[:10], None)
    tmpfs.fill(small_disk, leave=8192)
    with dask.config.set(FAST_RETRIES), pytest.raises(DeliveryFailed, match="No space left"):
        sink.process(PADDED, None)                    # a PE failure, not 200 dead letters
    assert jsonl_rows(path) == list(range(10))
    sink.close()


def test_a_later_checkpoint_keeps_the_staging_of_a_commit_that_failed(small_disk):
    """Checkpoint 1 completed and its commit failed on the full disk; checkpoint 2 is taken
    after: its snapshot must still name checkpoint 1's epoch, or a restore from 2 deletes that
    staging as unknown and 1's rows are gone for good."""
    path = os.path.join(small_disk, "out.jsonl")
    sink = opened(JsonlSink(path=path))
    sink.process(PADDED, None)
    sink.pre_commit(1)
    filler = tmpfs.fill(small_disk, leave=8192)
    with dask.config.set(FAST_RETRIES), pytest.raises(Exception, match="No space left"):
        sink.commit(1)
    os.remove(filler)
    sink.process(ITEMS[:5], None)
    sink.pre_commit(2)
    saved = sink.snapshot()
    crash(sink)
    again = restored(JsonlSink(path=path), saved, 2)
    assert jsonl_rows(path) == list(range(200)) + list(range(5))
    again.close()


# -- the exactly-once Kafka sink's commit: a parked transaction stays parked until Kafka committed it
# (a stand-in producer here; tests/integration/test_kafka_exactly_once.py kills a real sink at each
# step of its commit against a real broker)

class Producer:
    """Answers ``commit_transaction`` with the errors given, in turn, then commits."""

    def __init__(self, *errors):
        self.errors, self.commits = list(errors), 0

    def commit_transaction(self, timeout):
        self.commits += 1
        if self.errors:
            from confluent_kafka import KafkaException

            raise KafkaException(self.errors.pop(0))


def kafka_sink_with(producer):
    from pescheduler.operators.kafka import KafkaSink

    sink = KafkaSink(topic="out", exactly_once=True)
    sink._prepared[1] = (producer, [(b"v", None)], "tid-0", (0, 0))
    return sink


def test_kafka_a_commit_kafka_calls_retriable_is_committed_again():
    from confluent_kafka import KafkaError

    producer = Producer(KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True))
    sink = kafka_sink_with(producer)
    with dask.config.set(FAST_RETRIES):
        sink.commit(1)
    assert producer.commits == 2 and sink._prepared == {} and sink._pool == [producer]


def test_kafka_a_commit_that_must_abort_fails_the_pe_and_keeps_the_transaction_parked():
    from confluent_kafka import KafkaError

    producer = Producer(KafkaError(KafkaError._STATE, "must abort", txn_requires_abort=True))
    sink = kafka_sink_with(producer)
    with dask.config.set(FAST_RETRIES), pytest.raises(DeliveryFailed, match="must abort"):
        sink.commit(1)
    assert list(sink._prepared) == [1], "the parked transaction was forgotten"
    assert sink.snapshot()["parked"][0][0] == 1        # a later checkpoint still carries it

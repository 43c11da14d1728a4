"""The ``delta`` and ``iceberg`` sinks' two-phase commits, driven as the checkpoint coordinator
drives them, against real tables (delta-rs on a local directory, pyiceberg's SQL catalog on
SQLite): one table commit per checkpoint, nothing visible before its commit, a replayed commit
adds nothing, a restored sink drops what came after its checkpoint, a new deployment appends."""

from __future__ import annotations

import dask.config
import pyarrow as pa
import pytest

from pescheduler.errors import DeliveryFailed
from pescheduler.operator import Emitter, OperatorContext
from pescheduler.operators.delta import DeltaSink
from pescheduler.operators.iceberg import IcebergSink

FAST_RETRIES = {"pescheduler.sinks.retry.backoff": "1ms", "pescheduler.sinks.retry.max-backoff": "1ms"}


class Delta:
    def __init__(self, tmp_path):
        self.path = str(tmp_path / "delta")

    def sink(self, **kw):
        return DeltaSink(path=self.path, **kw)

    def rows(self) -> list:
        from deltalake import DeltaTable

        try:
            return sorted(DeltaTable(self.path).to_pyarrow_table().to_pylist(), key=lambda r: r["n"])
        except Exception:                       # no table yet
            return []

    def commits(self) -> int:
        from deltalake import DeltaTable

        return len([h for h in DeltaTable(self.path).history() if h["operation"] == "WRITE"])


class Iceberg:
    def __init__(self, tmp_path):
        self.catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                        "warehouse": f"file://{tmp_path}/warehouse"}

    def sink(self, **kw):
        return IcebergSink(catalog=self.catalog, table="lake.numbers", **kw)

    def _table(self):
        from pyiceberg.catalog import load_catalog

        return load_catalog("default", **self.catalog).load_table("lake.numbers")

    def rows(self) -> list:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return sorted(self._table().scan().to_arrow().to_pylist(), key=lambda r: r["n"])
        except (NoSuchTableError, NoSuchNamespaceError):
            return []

    def commits(self) -> int:
        return len(self._table().metadata.snapshots)


@pytest.fixture(params=[Delta, Iceberg], ids=["delta", "iceberg"])
def fmt(request, tmp_path):
    return request.param(tmp_path)


def opened(sink, checkpoint=True):
    sink.open(OperatorContext("sink-1", extra={"checkpoint": checkpoint}))
    return sink


def rows(first, count, key=None):
    return [{"n": i, "k": f"k{i % 2}"} for i in range(first, first + count)]


def test_rows_are_visible_only_once_their_checkpoint_commits_one_commit_each(fmt):
    sink = opened(fmt.sink(partition_by="k"))
    sink.process(rows(0, 10), Emitter())
    sink.process(pa.RecordBatch.from_pylist(rows(10, 5)), Emitter())     # columnar batches too
    sink.pre_commit(1)
    assert fmt.rows() == []                                               # staged, not visible
    sink.process(rows(15, 5), Emitter())
    sink.pre_commit(2)
    sink.commit(1)
    assert [r["n"] for r in fmt.rows()] == list(range(15))
    sink.commit(2)
    sink.commit(2)                                                        # idempotent
    assert [r["n"] for r in fmt.rows()] == list(range(20)) and fmt.commits() == 2


def test_a_replayed_commit_after_a_crash_writes_nothing_twice(fmt):
    sink = opened(fmt.sink())
    sink.process(rows(0, 10), Emitter())
    sink.pre_commit(1)
    state = sink.snapshot()
    sink.commit(1)                          # published, then the worker dies before it is recorded
    sink.process(rows(10, 7), Emitter())    # after the checkpoint: replayed by the sources
    sink.pre_commit(2)
    fresh = fmt.sink()                      # recovery from checkpoint 1: restore, open, commit(1), abort(2)
    fresh.restore(state)
    opened(fresh)
    fresh.commit(1)
    fresh.abort(2)
    fresh.process(rows(10, 7), Emitter())   # the replay
    fresh.flush(Emitter())
    assert [r["n"] for r in fmt.rows()] == list(range(17)) and fmt.commits() == 2


def test_a_new_deployment_appends_under_a_new_writer_from_checkpoint_one_again(fmt):
    for first in (0, 5):
        sink = opened(fmt.sink())
        sink.process(rows(first, 5), Emitter())
        sink.pre_commit(1)
        sink.commit(1)
    assert [r["n"] for r in fmt.rows()] == list(range(10))


def test_without_checkpoints_commits_every_rows_and_at_the_end(fmt):
    sink = opened(fmt.sink(rows=4), checkpoint=False)
    sink.process(rows(0, 5), Emitter())
    assert len(fmt.rows()) == 5
    sink.process(rows(5, 2), Emitter())
    sink.flush(Emitter())
    assert [r["n"] for r in fmt.rows()] == list(range(7)) and fmt.commits() == 2


def test_iceberg_partitions_by_identity_and_refuses_a_table_without_namespace(tmp_path):
    fmt = Iceberg(tmp_path)
    sink = opened(fmt.sink(partition_by="k"))
    sink.process(rows(0, 4), Emitter())
    sink.flush(Emitter())
    assert [f.name for f in fmt._table().spec().fields] == ["k"]
    with pytest.raises(ValueError, match="namespace.name"):
        IcebergSink(catalog=fmt.catalog, table="numbers")


def test_a_commit_that_fails_half_way_is_finished_by_the_next_one(fmt, monkeypatch):
    sink = opened(fmt.sink())
    for cid, first in ((1, 0), (2, 5)):
        sink.process(rows(first, 5), Emitter())
        sink.pre_commit(cid)
    append, calls = type(sink)._append, []

    def failing_second(self, table, checkpoint_id):
        calls.append(checkpoint_id)
        if checkpoint_id == 2:
            raise OSError("the store went away")
        append(self, table, checkpoint_id)

    monkeypatch.setattr(type(sink), "_append", failing_second)
    with dask.config.set(FAST_RETRIES), pytest.raises(DeliveryFailed, match="the store went away"):
        sink.commit(2)
    assert calls == [1, 2, 2, 2, 2, 2], "the failing commit was not tried again (5 tries)"
    assert [r["n"] for r in fmt.rows()] == list(range(5))
    monkeypatch.setattr(type(sink), "_append", append)
    sink.commit(2)
    assert [r["n"] for r in fmt.rows()] == list(range(10)) and fmt.commits() == 2


def test_a_commit_that_landed_but_answered_with_an_error_is_retried_without_writing_twice(fmt, monkeypatch):
    """A transient error after the table took the commit (a lost answer): the retry asks the
    table again, finds its checkpoint there, and writes nothing more."""
    sink = opened(fmt.sink())
    sink.process(rows(0, 5), Emitter())
    sink.pre_commit(1)
    append, calls = type(sink)._append, []

    def landed_then_failed(self, table, checkpoint_id):
        calls.append(checkpoint_id)
        append(self, table, checkpoint_id)
        if len(calls) == 1:
            raise OSError("connection reset after the commit")

    monkeypatch.setattr(type(sink), "_append", landed_then_failed)
    with dask.config.set(FAST_RETRIES):
        sink.commit(1)
    assert calls == [1]
    assert [r["n"] for r in fmt.rows()] == list(range(5)) and fmt.commits() == 1


def test_an_iceberg_sql_catalog_made_by_another_process_at_the_same_moment_is_tried_again(tmp_path, monkeypatch):
    """Two processes open a fresh SQL catalog at once (a sink's worker and the program reading
    the table): both find its own tables missing, both create them, and the second's CREATE fails
    ("table iceberg_tables already exists", SQLAlchemy's OperationalError). The commit is tried
    again and lands once. Before, that error was not among the ones tried again: the commit,
    and the PE, failed (seen under load in the docs' CDC-to-Iceberg block)."""
    import sqlite3

    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.exc import OperationalError

    fmt = Iceberg(tmp_path)
    sink = opened(fmt.sink())
    sink.process(rows(0, 5), Emitter())
    sink.pre_commit(1)
    create, raced = SqlCatalog.create_tables, []

    def made_meanwhile(self):
        create(self)                            # the other process's, just before this one's
        if not raced:
            raced.append(True)
            raise OperationalError("CREATE TABLE iceberg_tables", {},
                                   sqlite3.OperationalError("table iceberg_tables already exists"))
    monkeypatch.setattr(SqlCatalog, "create_tables", made_meanwhile)
    with dask.config.set(FAST_RETRIES):
        sink.commit(1)
    assert raced and [r["n"] for r in fmt.rows()] == list(range(5)) and fmt.commits() == 1

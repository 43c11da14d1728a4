"""The parquet sink on an fsspec file system without rename (``memory://``): staged per checkpoint,
published at ``commit``, a crash and restore give every row once, and DuckDB's ``read_parquet``
reads the directory as the table (through the same fsspec file system)."""

from __future__ import annotations

import uuid

import duckdb
import fsspec
import pytest

from pescheduler.operator import OperatorContext
from pescheduler.operators.sinks import ParquetSink

ITEMS = [{"n": i, "k": i % 3} for i in range(60)]


@pytest.fixture
def url():
    root = f"memory://parquet-{uuid.uuid4().hex}"
    yield root
    fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def duckdb_rows(url: str) -> list:
    con = duckdb.connect()
    con.register_filesystem(fsspec.filesystem("memory"))
    if not fsspec.filesystem("memory").glob(f"{url.removeprefix('memory://')}/**/*.parquet"):
        return []
    return [r[0] for r in con.sql(f"select n from read_parquet('{url}/**/*.parquet') order by n").fetchall()]


def opened(url, state=None):
    sink = ParquetSink(path=url, rows=8, partition_by="k")
    if state is not None:
        sink.restore(state)
    sink.open(OperatorContext("parquet-1", extra={"checkpoint": True}))
    return sink


def test_staged_files_appear_only_at_commit_and_duckdb_reads_them(url):
    sink = opened(url)
    sink.process(ITEMS[:20], None)
    sink.pre_commit(1)
    assert duckdb_rows(url) == []                       # staged under a hidden name: not the table's
    sink.commit(1)
    assert duckdb_rows(url) == list(range(20))
    sink.process(ITEMS[20:], None)
    sink.flush(None)
    assert duckdb_rows(url) == list(range(60))


def test_a_crash_after_a_commit_and_a_restore_give_every_row_once(url):
    sink = opened(url)
    sink.process(ITEMS[:20], None)
    sink.pre_commit(1)
    state = sink.snapshot()
    sink.commit(1)
    sink.process(ITEMS[20:35], None)                    # after the checkpoint: lost with the worker
    sink.pre_commit(2)
    fresh = opened(url, state)                          # recovery from checkpoint 1
    fresh.commit(1)
    fresh.abort(2)
    fresh.process(ITEMS[20:], None)                     # the replay
    fresh.flush(None)
    assert duckdb_rows(url) == list(range(60))

"""The parquet sink: rolled, partitioned, atomic files whose rows equal the input (read with pyarrow)."""

from __future__ import annotations

import os

import pyarrow.dataset as ds

from pescheduler.operators.sinks import ParquetSink
from pescheduler.testing import run_operators


def rows(n):
    return [{"car": i % 3, "speed": float(i), "ts": i * 1000} for i in range(n)]


def read(path, partitioning=None):
    table = ds.dataset(str(path), format="parquet", partitioning=partitioning).to_table()
    return sorted(table.to_pylist(), key=lambda r: r["ts"])


def parquet_files(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def test_rows_are_split_into_files_of_at_most_rows(tmp_path):
    run_operators(rows(250), ParquetSink(path=str(tmp_path), rows=100), batch_size=30)
    assert read(tmp_path) == rows(250)
    assert len(parquet_files(tmp_path)) == 3 and not any(f.startswith(".") for f in parquet_files(tmp_path))


def test_roll_by_event_time_window_writes_each_window_once_complete(tmp_path):
    run_operators(rows(125), ParquetSink(path=str(tmp_path), roll="60s"), batch_size=10, max_delay=0)
    assert read(tmp_path) == rows(125)
    assert len(parquet_files(tmp_path)) == 3              # windows [0,60), [60,120), [120,125)


def test_partition_by_a_field_makes_hive_directories(tmp_path):
    run_operators(rows(90), ParquetSink(path=str(tmp_path), partition_by="car"))
    assert {f.split("/")[0] for f in parquet_files(tmp_path)} == {"car=0", "car=1", "car=2"}
    assert read(tmp_path, partitioning="hive") == [{"speed": r["speed"], "ts": r["ts"], "car": r["car"]}
                                                   for r in rows(90)]


def test_a_fresh_sink_replaces_an_earlier_runs_files_and_a_restored_one_keeps_them(tmp_path):
    run_operators(rows(50), ParquetSink(path=str(tmp_path), rows=20))
    run_operators(rows(30), ParquetSink(path=str(tmp_path), rows=20))
    assert read(tmp_path) == rows(30)
    moved = ParquetSink(path=str(tmp_path), rows=1000)
    moved.restore({"buffers": {0: rows(40)[30:]}, "seq": 10})
    run_operators([], moved)
    assert read(tmp_path) == rows(40)

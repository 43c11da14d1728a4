"""The ``files`` source on real fsspec file systems (a local directory and ``memory://``): formats,
name order, positions (file + row) through ``seek`` on a fresh instance, copies splitting the
files, watching for new files, and bad input dead-lettered."""

from __future__ import annotations

import json
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pescheduler.operator import OperatorContext, Share
from pescheduler.operators.files import FilesSource


def opened(**params) -> FilesSource:
    src = FilesSource(**params)
    src.open(OperatorContext("files-1"))
    return src


def drain(src: FilesSource, n: int = 3) -> list:
    rows = []
    while (batch := src.read(n)) is not None:
        rows.extend(batch.to_pylist() if isinstance(batch, pa.RecordBatch) else batch)
        if batch == [] and not src.watch:
            break
    return rows


def write_parquet(fs, path: str, first: int, count: int, group: int = 4) -> None:
    with fs.open(path, "wb") as f:
        pq.write_table(pa.table({"n": list(range(first, first + count))}), f, row_group_size=group)


@pytest.fixture
def memdir():
    root = f"memory://files-{uuid.uuid4().hex}"
    yield root
    fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def test_parquet_files_are_read_in_name_order_skipping_hidden_names(memdir):
    fs = fsspec.filesystem("memory")
    write_parquet(fs, f"{memdir}/b.parquet", 10, 10)
    write_parquet(fs, f"{memdir}/a.parquet", 0, 10)
    write_parquet(fs, f"{memdir}/.c.parquet.tmp", 99, 5)
    write_parquet(fs, f"{memdir}/_staging/d.parquet", 99, 5)
    assert drain(opened(path=memdir)) == [{"n": i} for i in range(20)]


def test_columnar_parquet_gives_record_batches(memdir):
    write_parquet(fsspec.filesystem("memory"), f"{memdir}/a.parquet", 0, 10, group=10)
    batch = opened(path=memdir, columnar=True, columnar_rows=4).read(2)
    assert isinstance(batch, pa.RecordBatch) and batch.column("n").to_pylist() == [0, 1, 2, 3]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_a_fresh_instance_seeks_to_the_file_and_row_and_reads_on_exactly(tmp_path, fmt):
    for name, first in (("a", 0), ("b", 10)):
        path = tmp_path / f"{name}.{fmt}"
        if fmt == "parquet":
            write_parquet(fsspec.filesystem("file"), str(path), first, 10)
        elif fmt == "jsonl":
            path.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(first, first + 10)))
        else:
            path.write_text("n\n" + "".join(f"{i}\n" for i in range(first, first + 10)))
    src = opened(path=str(tmp_path), format=fmt)
    head = src.read(3) + src.read(3) + src.read(5) + src.read(3)      # into the second file
    position = json.loads(json.dumps(src.position()))                   # survives JSON
    fresh = FilesSource(path=str(tmp_path), format=fmt)
    fresh.seek(position)
    fresh.open(OperatorContext("files-1"))
    rows = head + drain(fresh)
    assert [int(r["n"]) for r in rows] == list(range(20))


def test_copies_split_the_files_and_their_positions_union_to_the_whole(memdir):
    fs = fsspec.filesystem("memory")
    for i in range(8):
        write_parquet(fs, f"{memdir}/f{i}.parquet", 10 * i, 10)
    copies = []
    for index in range(2):
        src = FilesSource(path=memdir)
        src.share = Share(index, 2)
        src.open(OperatorContext("files-1"))
        copies.append(src)
    parts = [drain(src) for src in copies]
    assert all(parts) and sorted(r["n"] for p in parts for r in p) == list(range(80))
    union = {**copies[0].position(), **copies[1].position()}
    assert len(union) == 8 and set(union.values()) == {-1}


def test_watch_picks_up_files_written_later(memdir):
    fs = fsspec.filesystem("memory")
    src = opened(path=memdir, watch=True, poll="0s")
    assert src.read(10) == []                       # not there yet: waits, no error
    write_parquet(fs, f"{memdir}/a.parquet", 0, 3)
    assert src.read(10) == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert src.read(10) == []
    write_parquet(fs, f"{memdir}/b.parquet", 3, 2)
    assert src.read(10) == [{"n": 3}, {"n": 4}]


def test_bad_lines_and_unreadable_files_are_dead_lettered_and_the_stream_goes_on(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"n": 0}\nnot json\n\n{"n": 1}\n')
    src = opened(path=str(tmp_path), format="jsonl")
    assert drain(src) == [{"n": 0}, {"n": 1}]
    [dead] = src.take_rejected()
    assert dead.item["line"] == 2 and "a.jsonl:2: not JSON" in dead.error
    (tmp_path / "b.parquet").write_bytes(b"not parquet")
    src = opened(path=str(tmp_path / "*.parquet"))
    assert drain(src) == []
    [dead] = src.take_rejected()
    assert dead.item == {"file": str(tmp_path / "b.parquet")} and "cannot read as parquet" in dead.error


def test_a_missing_path_is_named_and_a_bad_format_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        opened(path=str(tmp_path / "nowhere")).read(10)
    with pytest.raises(ValueError, match="format must be one of parquet, jsonl, csv"):
        FilesSource(path=str(tmp_path), format="xml")


def test_a_file_that_breaks_while_read_is_dead_lettered_from_the_row_reached(tmp_path):
    table = pa.table({"n": list(range(100))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=10)
    page = pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(5).column(0).data_page_offset
    data = bytearray((tmp_path / "a.parquet").read_bytes())
    data[page:page + 16] = b"\xff" * 16                   # the 6th row group's page header
    (tmp_path / "a.parquet").write_bytes(bytes(data))
    write_parquet(fsspec.filesystem("file"), str(tmp_path / "b.parquet"), 100, 5)
    src = opened(path=str(tmp_path))
    rows = drain(src, n=10)
    [dead] = src.take_rejected()
    assert dead.item["file"].endswith("a.parquet") and "unreadable from row 50" in dead.error
    assert [r["n"] for r in rows] == list(range(50)) + list(range(100, 105))   # the next file read on

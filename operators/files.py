"""The ``files`` source: Parquet, jsonl or CSV files from any fsspec URL (a directory, a glob or one file).

Each file is a partition of the source, numbered by a hash of its path, so
copies of the source split the files between them as Kafka copies split
partitions (:class:`~pescheduler.operators.partitions.PartitionedSource`),
and a file found later goes to the same copy whatever the others found.
The position is ``{file: rows read}`` (``-1``: read to its end), so a
checkpoint records the file and the row, and ``seek`` reads on from there.
"""

from __future__ import annotations

import csv
import io
import json
import time
import zlib
from itertools import islice
from typing import Any, Iterator

from pescheduler.operator import Parallelism
from pescheduler.timeutil import parse_duration

from .partitions import PartitionedSource

FORMATS = ("parquet", "jsonl", "csv")
DONE = -1                   # a position's rows for a file read to its end


class FilesSource(PartitionedSource):
    """Rows of the files at ``path``: ``app.source("files", path="s3://bucket/events/", format="parquet")``.

    ``path``: an fsspec URL or local path: a directory (every file below it,
    recursively, except names starting with ``.`` or ``_``, which writers keep
    for files in progress), a glob (``data/*.csv``) or a file. Files are read in
    name order. ``watch=True`` never ends: the listing is read again every
    ``poll`` once every known file is read, and new files are picked up (write
    a file whole, e.g. under a hidden name, then rename it). ``format``:
    ``"parquet"`` (Arrow record batches when ``columnar=True``, as the
    ``generator`` gives them; rows as dicts otherwise), ``"jsonl"`` (a line
    that is not JSON is dead-lettered with its file and line) or ``"csv"``
    (a header line; values are text). ``storage_options`` go to fsspec.
    """

    name = "files"
    parallelism = Parallelism.STATELESS
    requires = ("pyarrow",)             # the default format; jsonl and csv need only fsspec
    install = "pescheduler[lakehouse]"

    def __init__(self, path: str, format: str = "parquet", watch: bool = False, poll: Any = "1s",
                 columnar: bool = False, columnar_rows: int = 65_536, storage_options: dict | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if format not in FORMATS:
            raise ValueError(f"files source: format must be one of {', '.join(FORMATS)}, got {format!r}")
        self.path, self.format, self.watch = str(path), format, watch
        self.poll_s = parse_duration(poll) / 1000
        self.columnar, self.columnar_rows = columnar, columnar_rows
        self.storage_options = storage_options or {}
        self._fs = None
        self._listed: list[str] = []        # this copy's files, in name order, as last listed
        self._listed_at = float("-inf")
        self._file: str | None = None       # the file being read, and its batches
        self._batches: Iterator | None = None

    def open(self, context: Any) -> None:
        import fsspec

        super().open(context)
        self._fs, self._root = fsspec.core.url_to_fs(self.path, **self.storage_options)

    def _number(self, partition: str) -> int:
        return zlib.crc32(partition.encode())

    # -- reading -------------------------------------------------------------------
    def read(self, n: int) -> Any:
        if self.columnar:
            n = max(n, self.columnar_rows)
        while True:
            if self._batches is None and not self._next_file(n):
                return [] if self.watch else None
            batch = self._next_batch()
            if batch is None:
                self._positions[self._file] = DONE
                self._file = self._batches = None
                continue
            self._positions[self._file] += len(batch)
            rows = _as_rows(batch, self.columnar)
            if len(rows):
                return rows

    def _next_batch(self) -> Any:
        """The current file's next batch, ``None`` at its end; a file that breaks while it is read
        (a corrupt row group) is dead-lettered from the row reached and left."""
        try:
            return next(self._batches, None)
        except Exception as exc:
            row = self._positions[self._file]
            self.reject({"file": self._file, "row": row}, f"{self._file}: unreadable from row {row} ({exc!r})")
            return None

    def _next_file(self, n: int) -> bool:
        """Open the first of this copy's files not read to its end; False when there is none now."""
        for name in self._unread():
            self._file = name
            skip = self._positions.setdefault(name, 0)
            self._batches = self._open_batches(name, skip, n)
            return True
        return False

    def _unread(self) -> list[str]:
        pending = [f for f in self._listed if self._positions.get(f, 0) != DONE]
        if pending or (self._listed_at > float("-inf") and not self.watch):
            return pending
        if time.monotonic() - self._listed_at < self.poll_s:
            return []
        self._listed_at = time.monotonic()
        self._listed = [f for f in self._list() if self.share(self._number(f))]
        return [f for f in self._listed if self._positions.get(f, 0) != DONE]

    def _list(self) -> list[str]:
        """Every file at ``path`` in name order (hidden and ``_`` names skipped); a missing path
        is an error naming it, unless watched (it may appear)."""
        fs, root = self._fs, self._root
        if any(c in root for c in "*?["):
            found = fs.glob(root)
        elif fs.isdir(root):
            found = fs.find(root)
        elif fs.exists(root):
            found = [root]
        elif self.watch:
            found = []
        else:
            raise FileNotFoundError(f"files source: {self.path} does not exist")
        return sorted(f for f in found if not _hidden(f, root) and fs.isfile(f))

    def _open_batches(self, name: str, skip: int, n: int) -> Iterator:
        """The batches of ``name`` after its first ``skip`` rows; a file that cannot be read is
        dead-lettered whole and the stream goes on."""
        try:
            return _READERS[self.format](self, name, skip, n)
        except Exception as exc:
            self.reject({"file": name}, f"{name}: cannot read as {self.format} ({exc!r})")
            return iter(())

    def _parquet(self, name: str, skip: int, n: int) -> Iterator:
        import pyarrow.parquet as pq

        handle = self._fs.open(name, "rb")
        meta = pq.ParquetFile(handle)
        first, start = 0, 0
        while first < meta.num_row_groups and start + meta.metadata.row_group(first).num_rows <= skip:
            start += meta.metadata.row_group(first).num_rows
            first += 1
        groups = list(range(first, meta.num_row_groups))
        return _after(meta.iter_batches(batch_size=n, row_groups=groups) if groups else iter(()),
                      skip - start, handle)

    def _jsonl(self, name: str, skip: int, n: int) -> Iterator:
        handle = self._fs.open(name, "rb")
        lines = enumerate(handle, 1)
        for _ in islice(lines, skip):
            pass
        return _closing(self._json_batches(name, lines, n), handle)

    def _json_batches(self, name: str, lines: Iterator, n: int) -> Iterator[list]:
        while chunk := list(islice(lines, n)):
            batch = []
            for number, line in chunk:
                if line.isspace():
                    batch.append(None)          # a row of the file: counted, not emitted
                    continue
                try:
                    batch.append(json.loads(line))
                except ValueError as exc:
                    batch.append(None)
                    self.reject({"file": name, "line": number, "text": line.decode(errors="replace").rstrip()},
                                f"{name}:{number}: not JSON ({exc})")
            yield _Counted(batch)

    def _csv(self, name: str, skip: int, n: int) -> Iterator:
        handle = self._fs.open(name, "rb")
        rows = csv.DictReader(io.TextIOWrapper(handle, encoding="utf-8", newline=""))
        for _ in islice(rows, skip):
            pass
        return _closing(iter(lambda: list(islice(rows, n)), []), handle)

    def seek(self, position: dict) -> None:
        self._positions.update(position)
        self._file = self._batches = None
        self._listed_at = float("-inf")

    def close(self) -> None:
        self._file = self._batches = None


_READERS = {"parquet": FilesSource._parquet, "jsonl": FilesSource._jsonl, "csv": FilesSource._csv}


class _Counted(list):
    """A jsonl batch whose ``None`` entries (blank or rejected lines) count as rows read but are
    not emitted: the position is in lines, so a restore skips exactly the lines read."""


def _as_rows(batch: Any, columnar: bool) -> Any:
    if isinstance(batch, list):
        rows = [t for t in batch if t is not None] if isinstance(batch, _Counted) else batch
        if columnar and rows:
            import pyarrow as pa

            return pa.RecordBatch.from_pylist(rows)
        return rows
    return batch if columnar else batch.to_pylist()


def _after(batches: Iterator, skip: int, handle: Any) -> Iterator:
    """``batches`` without their first ``skip`` rows, ``handle`` closed at the end."""
    for batch in batches:
        if skip >= len(batch):
            skip -= len(batch)
            yield batch.slice(0, 0)             # counted as nothing: the rows were read before
            continue
        yield batch.slice(skip) if skip else batch
        skip = 0
    handle.close()


def _closing(batches: Iterator, handle: Any) -> Iterator:
    yield from batches
    handle.close()


def _hidden(path: str, root: str) -> bool:
    """Whether a name below ``root`` starts with ``.`` or ``_`` (a writer's file in progress, a
    ``_SUCCESS`` marker, a table's log)."""
    relative = path[len(root):] if path.startswith(root) else path.rsplit("/", 1)[-1]
    return any(part[:1] in (".", "_") for part in relative.split("/") if part)

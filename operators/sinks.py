"""Built-in sinks: ``jsonl`` (one JSON object per line, atomic per batch), ``print``,
``discard`` and ``parquet`` (rolled files a Spark batch job reads as a table)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pescheduler.operator import Emitter, Sink

# One encoder built once: json.dumps with non-default arguments builds a new
# encoder on every call, which dominates the cost of small tuples.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


def _lines(batch: list) -> str:
    return "\n".join(map(_encode, batch)) + "\n"


class JsonlSink(Sink):
    """Write tuples to ``path``, one compact JSON object per line (``default=str``).

    ``open`` creates the parent directories and truncates the file, unless the
    sink was restored from a snapshot (it moved to another PE or worker): then
    it appends where its predecessor stopped. Each batch
    is one ``os.write`` on an ``O_APPEND`` descriptor, so a reader (or a
    ``jsonl`` source following the file) never sees half a batch from a
    crash-free writer; ``flush`` fsyncs, so a finished stream is on disk.
    """

    name = "jsonl"

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = None
        self._continue = False

    def open(self, context: Any) -> None:
        super().open(context)
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        truncate = 0 if self._continue else os.O_TRUNC
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | truncate | os.O_APPEND, 0o644)

    def snapshot(self) -> dict:
        """Every batch is already in the file: a successor only needs to append."""
        if self._fd is not None:
            os.fsync(self._fd)
        return {"continue": True}

    def restore(self, state: dict | None) -> None:
        self._continue = bool(state and state.get("continue"))

    def process(self, batch: list, emit: Emitter) -> None:
        data = _lines(batch).encode()
        written = os.write(self._fd, data)
        while written < len(data):          # a short write (signal, huge batch): finish it
            written += os.write(self._fd, data[written:])

    def flush(self, emit: Emitter) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class PrintSink(Sink):
    """Print each tuple as one compact JSON line on standard output (one write per batch)."""

    name = "print"

    def process(self, batch: list, emit: Emitter) -> None:
        sys.stdout.write(_lines(batch))

    def flush(self, emit: Emitter) -> None:
        sys.stdout.flush()


class DiscardSink(Sink):
    """Count tuples and drop them (Flink's DiscardingSink): for benchmarks and dry runs.

    The count is the operator's ``tuples_in`` in the status.
    """

    name = "discard"
    columnar = True         # an Arrow batch is dropped whole

    def process(self, batch: list, emit: Emitter) -> None:
        pass


class ParquetSink(Sink):
    """Write tuples as Parquet files under the directory ``path``: a table Spark reads as is.

    ``spark.read.parquet(path)`` (or pyarrow's ``dataset``) reads every file
    as one table. Files are *rolled*: at most ``rows`` rows each, and with
    ``roll`` (an event-time window such as ``"60s"``) one set of files per
    window, written once the watermark passes the window's end, so a batch job
    sees a window complete or not at all. ``partition_by`` names a field whose
    values become Hive-style directories (``car=7/``), as Spark partitions a
    table; the field is then stored in the directory name, not in the file.

    Each file is written under a hidden name (Spark skips ``.``-files) and
    renamed into place, so a reader never sees half a file. Rows not yet
    written are operator state: they move with the sink when it is
    reconfigured. A fresh sink (not restored) first removes the files an
    earlier run of the same operator left in ``path``, as ``jsonl`` truncates.
    Keep each field's type stable across tuples: every file carries the
    schema pyarrow infers from its rows.
    """

    name = "parquet"

    def __init__(self, path: str | os.PathLike, rows: int = 100_000, roll: str | int | None = None,
                 partition_by: str | None = None, ts_field: str = "ts") -> None:
        from pescheduler.timeutil import parse_duration

        self.path = os.fspath(path)
        self.rows = int(rows)
        self.roll_ms = parse_duration(roll) if roll is not None else None
        self.partition_by = partition_by
        self.ts_field = ts_field
        self.buffers: dict[int, list] = {}       # window start (0 without roll) -> rows to write
        self.seq = 0
        self._restored = False

    def open(self, context: Any) -> None:
        super().open(context)
        self._writer = context.op_id.replace("#", "_copy")
        os.makedirs(self.path, exist_ok=True)
        if not self._restored:
            self._remove_earlier_files()

    def process(self, batch: list, emit: Emitter) -> None:
        if self.roll_ms is None:
            rows = self.buffers.setdefault(0, [])
            rows.extend(batch)
            if len(rows) >= self.rows:          # full files now; the rest waits for more rows
                cut = len(rows) - len(rows) % self.rows
                self._write(rows[:cut])
                self.buffers[0] = rows[cut:]
            return
        roll, ts = self.roll_ms, self.ts_field
        for t in batch:
            self.buffers.setdefault(t[ts] - t[ts] % roll, []).append(t)

    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        if self.roll_ms is not None:
            for start in sorted(w for w in self.buffers if w + self.roll_ms <= watermark):
                self._write(self.buffers.pop(start))

    def flush(self, emit: Emitter) -> None:
        for start in sorted(self.buffers):
            self._write(self.buffers.pop(start))

    def snapshot(self) -> dict:
        return {"buffers": {k: list(v) for k, v in self.buffers.items()}, "seq": self.seq}

    def restore(self, state: dict | None) -> None:
        if state:
            self.buffers = {k: list(v) for k, v in state["buffers"].items()}
            self.seq, self._restored = state["seq"], True

    def _write(self, rows: list) -> None:
        """``rows`` as files of at most ``self.rows`` rows, per partition value."""
        groups: dict[Any, list] = {}
        for t in rows:
            groups.setdefault(t[self.partition_by] if self.partition_by else None, []).append(t)
        for value, part in groups.items():
            folder = self.path if value is None else os.path.join(self.path, f"{self.partition_by}={value}")
            for i in range(0, len(part), self.rows):
                self._write_file(folder, part[i:i + self.rows])

    def _write_file(self, folder: str, rows: list) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.partition_by:
            rows = [{k: v for k, v in t.items() if k != self.partition_by} for t in rows]
        os.makedirs(folder, exist_ok=True)
        self.seq += 1
        name = f"part-{self._writer}-{self.seq:06d}.parquet"
        tmp = os.path.join(folder, f".{name}.tmp")
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, os.path.join(folder, name))

    def _remove_earlier_files(self) -> None:
        prefix = f"part-{self._writer}-"
        for folder, _dirs, files in os.walk(self.path):
            for f in files:
                if f.startswith(prefix) and f.endswith(".parquet"):
                    os.remove(os.path.join(folder, f))

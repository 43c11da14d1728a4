"""Built-in sinks: ``jsonl`` (one JSON object per line, atomic per batch), ``print``,
``discard`` and ``parquet`` (rolled files a Spark batch job reads as a table)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

from pescheduler.operator import Emitter, Sink

from .staging import Epochs, clear, epoch_of, retried, serialized, staging_dir

# One encoder built once: json.dumps with non-default arguments builds a new
# encoder on every call, which dominates the cost of small tuples.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


def _lines(batch: list) -> str:
    return "\n".join(map(_encode, batch)) + "\n"


class JsonlSink(Sink):
    """Write tuples to ``path``, one compact JSON object per line (``default=str``).

    ``open`` creates the parent directories and truncates the file, unless the
    sink was restored from a snapshot (it moved to another PE or worker, or a
    checkpoint is restored): then it goes on where that snapshot left the file.
    An Arrow batch is written as the same lines its rows would give, formatted
    column by column (``json_lines.py``). Each batch is one ``os.write`` on an ``O_APPEND`` descriptor, so a reader
    (or a ``jsonl`` source following the file) never sees half a batch from a
    crash-free writer; ``flush`` fsyncs, so a finished stream is on disk.

    With checkpoints (two-phase commit, exactly-once): from the first
    ``pre_commit`` on (or from ``open`` when ``context.extra["checkpoint"]`` is
    set), batches go to a staging file ``.<name>.staging/e<epoch>.part`` beside
    ``path``, one per epoch between barriers. ``pre_commit(id)`` fsyncs and
    seals the epoch; ``commit(id)`` appends the sealed epochs of ids up to
    ``id`` to ``path`` and removes their parts. The snapshot records the size
    ``path`` had and the sealed epochs with their sizes, so ``restore`` cuts
    ``path`` back to exactly what the restored checkpoint had published (a
    commit that crashed half-way included) and drops staging written after it.

    A write that fails (a full disk) is cut back to where it began, so no torn
    line stays, and tried again (``pescheduler.sinks.retry.*``); then the PE
    fails (:class:`~pescheduler.errors.DeliveryFailed`), never dead letters
    with later output published past the gap. An epoch stays pending until
    its part is appended and fsynced: ``commit`` may be called again after a
    failure and publishes each epoch exactly once.
    """

    name = "jsonl"
    may_block = True          # retries a failed write or commit (staging.retried)
    columnar = True           # an Arrow batch is written as its rows' lines, without rows (json_lines.py)

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = None
        self._state: dict | None = None         # from restore: what open() reinstates
        self._staged = False                    # two-phase mode: output goes to the epoch's part
        self._epochs = Epochs()
        self._part: int | None = None           # the open epoch's part file
        self._part_size = 0

    def open(self, context: Any) -> None:
        super().open(context)
        self._staging = staging_dir(self.path)
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        truncate = 0 if self._state else os.O_TRUNC
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | truncate | os.O_APPEND, 0o644)
        if self._state:
            self._reinstate(self._state)
        else:
            clear(self._staging)
        self._staged = self._staged or bool(context.extra.get("checkpoint"))

    @serialized
    def snapshot(self) -> dict:
        """What is published (the file's size) and what is staged (epochs and sizes); durable."""
        if self._fd is None:                    # not open: what it was restored with, or closed with
            return dict(self._state or {"continue": True})
        os.fsync(self._fd)
        if self._part is not None:
            os.fsync(self._part)
        return self._where()

    def _where(self) -> dict:
        return {"continue": True, "size": os.fstat(self._fd).st_size, "staged": self._staged,
                "epochs": self._epochs.state(), "open": self._part_size}

    def restore(self, state: dict | None) -> None:
        self._state = state if state and state.get("continue") else None

    def _reinstate(self, state: dict) -> None:
        """Files as the snapshot left them: published epochs since kept, the rest cut away."""
        if "size" not in state:                 # a snapshot of an older version: append on
            return
        self._staged, self._epochs = state["staged"], Epochs.of(state["epochs"])
        size = state["size"] + sum(n for _c, e, n in self._epochs.pending if not os.path.exists(self._part_path(e)))
        have = os.fstat(self._fd).st_size
        if have < size:
            raise RuntimeError(f"jsonl sink: {self.path} has {have} bytes but the restored checkpoint "
                               f"published {size}; was it changed or replaced outside the stream?")
        os.ftruncate(self._fd, size)            # drop a half-done commit and anything published later
        os.fsync(self._fd)
        for name in os.listdir(self._staging) if os.path.isdir(self._staging) else []:
            epoch = epoch_of(name)
            if epoch is None or not self._epochs.known(epoch):
                os.remove(os.path.join(self._staging, name))
        self._part_size = state["open"]
        current = self._part_path(self._epochs.current)
        if os.path.exists(current):
            os.truncate(current, self._part_size)
        elif self._part_size:
            raise RuntimeError(f"jsonl sink: staging file {current} of the restored snapshot is gone")

    def _part_path(self, epoch: int) -> str:
        return os.path.join(self._staging, f"e{epoch:010d}.part")

    @serialized
    def process(self, batch: Any, emit: Emitter) -> None:
        if isinstance(batch, list):
            data = _lines(batch).encode()
        else:
            from .json_lines import arrow_lines

            data = arrow_lines(batch, _encode)
            if not data:
                return
        if self._staged:
            if self._part is None:
                os.makedirs(self._staging, exist_ok=True)
                self._part = os.open(self._part_path(self._epochs.current),
                                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            _append(self._part, data, f"jsonl sink: staging to {self._part_path(self._epochs.current)}")
            self._part_size += len(data)
        else:
            _append(self._fd, data, f"jsonl sink: writing to {self.path}")

    # -- two-phase commit --------------------------------------------------------------
    @serialized
    def pre_commit(self, checkpoint_id: int) -> None:
        """Seal what came since the last barrier under ``checkpoint_id`` (durable, not visible)."""
        if not self._staged:                    # the first barrier: staged from now on
            os.fsync(self._fd)
            self._staged = True
        if self._part is not None:
            os.fsync(self._part)
            os.close(self._part)
            self._part = None
        self._epochs.seal(checkpoint_id, self._part_size)
        self._part_size = 0

    @serialized
    def commit(self, checkpoint_id: float) -> None:
        """Append the sealed epochs of checkpoints up to ``checkpoint_id`` to the file, in order;
        each leaves the bookkeeping only once appended and fsynced (a failure cuts the file back
        and raises, and a later call publishes what is left)."""
        for _cid, epoch, _size in self._epochs.due(checkpoint_id):
            part = self._part_path(epoch)
            if os.path.exists(part):            # else published before a restore: restore kept it
                retried(f"jsonl sink: publishing {part} to {self.path}", lambda: self._publish(part))
            self._epochs.published(epoch)
            if os.path.exists(part):
                os.remove(part)

    def _publish(self, part: str) -> None:
        """Append ``part`` to the file and fsync; on an error the file is cut back to before it."""
        size = os.fstat(self._fd).st_size
        try:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 20):
                    _write_all(self._fd, chunk)
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, size)
            raise

    @serialized
    def flush(self, emit: Emitter) -> None:
        """End of stream: everything received is published (the stream's last checkpoint)."""
        if self._staged:
            self.pre_commit(float("inf"))
            self.commit(float("inf"))
        if self._fd is not None:
            os.fsync(self._fd)

    @serialized
    def abort(self, checkpoint_id: int) -> None:
        """Drop the epochs sealed for ``checkpoint_id`` and later, and the open one (the stream
        replays them). On a just-restored sink ``restore`` has done this already."""
        self._epochs.pending, dropped = ([p for p in self._epochs.pending if p[0] < checkpoint_id],
                                         [p for p in self._epochs.pending if p[0] >= checkpoint_id])
        if self._part is not None:
            os.close(self._part)
            self._part = None
        for epoch in [e for _c, e, _n in dropped] + [self._epochs.current]:
            if os.path.exists(self._part_path(epoch)):
                os.remove(self._part_path(epoch))
        self._part_size = 0

    @serialized
    def close(self) -> None:
        if self._fd is not None:
            self._state = self._where()         # a snapshot after close (a finished PE) says the same
        for fd in (self._fd, self._part):
            if fd is not None:
                os.close(fd)
        self._fd = self._part = None


def _append(fd: int, data: bytes, what: str) -> None:
    """Append ``data`` to ``fd`` whole or not at all: a failed write is cut back (no torn line)
    and tried again (:func:`~.staging.retried`), then fails the PE."""
    size = os.fstat(fd).st_size

    def write() -> None:
        try:
            _write_all(fd, data)
        except OSError:
            os.ftruncate(fd, size)
            raise
    retried(what, write)


def _write_all(fd: int, data: bytes) -> None:
    """One ``os.write`` of ``data`` (O_APPEND: atomic for readers), finished if it came up short."""
    written = os.write(fd, data)
    while written < len(data):              # a short write (signal, huge batch): finish it
        written += os.write(fd, data[written:])


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

    ``path`` is a local directory or any fsspec URL (``s3://bucket/table``,
    ``memory://table``; ``storage_options`` go to fsspec).
    ``spark.read.parquet(path)``, pyarrow's ``dataset`` or DuckDB's
    ``read_parquet('path/**/*.parquet')`` read every file as one table. Files are *rolled*: at most ``rows`` rows each, and with
    ``roll`` (an event-time window such as ``"60s"``) one set of files per
    window, written once the watermark passes the window's end, so a batch job
    sees a window complete or not at all. ``partition_by`` names a field whose
    values become Hive-style directories (``car=7/``), as Spark partitions a
    table; the field is then stored in the directory name, not in the file.

    Each file is written under a hidden name (Spark skips ``.``-files) and
    renamed into place, so a reader never sees half a file. An object store
    has no rename: there the file is copied to its name (an object appears
    whole) and the hidden one removed. Rows not yet
    written are operator state: they move with the sink when it is
    reconfigured. A fresh sink (not restored) first removes the files an
    earlier run of the same operator left in ``path``, as ``jsonl`` truncates.
    Keep each field's type stable across tuples: every file carries the
    schema pyarrow infers from its rows.

    With checkpoints (two-phase commit, exactly-once): from the first
    ``pre_commit`` on (or from ``open`` when ``context.extra["checkpoint"]`` is
    set), files are written under ``.<table>.staging-<writer>/e<epoch>/``
    beside ``path`` (outside it, so no reader's glob finds them) and
    ``commit(id)`` moves the files of the epochs sealed up to ``id`` into
    place; a move repeated after a crash writes the same name again. Without ``roll``, ``pre_commit`` also writes the rows buffered so
    far, so a checkpoint's rows are visible when it commits. Files are numbered (``seq``), so ``restore`` removes every file
    written after its snapshot, staged or published, and keeps the rest.
    """

    name = "parquet"
    may_block = True          # retries a failed write or commit (staging.retried)
    requires = ("pyarrow",)               # checked at deploy (pescheduler/requirements.py)
    install = "pescheduler[columnar]"

    def __init__(self, path: str | os.PathLike, rows: int = 100_000, roll: str | int | None = None,
                 partition_by: str | None = None, ts_field: str = "ts", storage_options: dict | None = None) -> None:
        from pescheduler.timeutil import parse_duration

        self.path = os.fspath(path)
        self.rows = int(rows)
        self.roll_ms = parse_duration(roll) if roll is not None else None
        self.partition_by = partition_by
        self.ts_field = ts_field
        self.storage_options = storage_options or {}
        self.buffers: dict[int, list] = {}       # window start (0 without roll) -> rows to write
        self.seq = 0
        self._restored = False
        self._staged = False
        self._epochs = Epochs()
        self._epoch_files = 0                    # files written in the open epoch

    def open(self, context: Any) -> None:
        import fsspec

        super().open(context)
        self._fs, self._root = fsspec.core.url_to_fs(self.path, **self.storage_options)
        self._writer = context.op_id.replace("#", "_copy")
        parent, _, base = self._root.rstrip("/").rpartition("/")
        self._staging = f"{parent}/.{base}.staging-{self._writer}"      # beside the table: no glob sees it
        self._fs.makedirs(self._root, exist_ok=True)
        if self._restored:
            self._remove_files_after(self.seq)
        else:
            self._remove_files_after(0)
            self._clear(self._staging)
        self._staged = self._staged or bool(context.extra.get("checkpoint"))

    @serialized
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

    @serialized
    def on_watermark(self, watermark: int, emit: Emitter) -> None:
        if self.roll_ms is not None:
            for start in sorted(w for w in self.buffers if w + self.roll_ms <= watermark):
                self._write(self.buffers.pop(start))

    @serialized
    def flush(self, emit: Emitter) -> None:
        for start in sorted(self.buffers):
            self._write(self.buffers.pop(start))
        if self._staged:                          # end of stream: the last checkpoint
            self.pre_commit(float("inf"))
            self.commit(float("inf"))

    @serialized
    def snapshot(self) -> dict:
        return {"buffers": {k: list(v) for k, v in self.buffers.items()}, "seq": self.seq,
                "staged": self._staged, "epochs": self._epochs.state(), "open": self._epoch_files}

    def restore(self, state: dict | None) -> None:
        if state:
            self.buffers = {int(k): list(v) for k, v in state["buffers"].items()}   # JSON keys are text
            self.seq, self._restored = state["seq"], True
            if "epochs" in state:
                self._staged, self._epochs = state["staged"], Epochs.of(state["epochs"])
                self._epoch_files = state["open"]

    # -- two-phase commit --------------------------------------------------------------
    @serialized
    def pre_commit(self, checkpoint_id: float) -> None:
        """Seal the files written since the last barrier under ``checkpoint_id``. Without ``roll``
        the rows buffered are written first (a file per checkpoint at least, as Flink's bulk
        formats roll on checkpoint); with ``roll`` an open window's rows stay state until the
        watermark closes it, so a window is still one set of files."""
        self._staged = True
        if self.roll_ms is None and self.buffers.get(0):
            self._write(self.buffers.pop(0))
        self._epochs.seal(checkpoint_id, self._epoch_files)
        self._epoch_files = 0

    @serialized
    def commit(self, checkpoint_id: float) -> None:
        """Rename the files of the epochs sealed up to ``checkpoint_id`` into place (idempotent:
        a file already renamed is no longer staged; a failed move is tried again, then fails the PE)."""
        for _cid, epoch, _files in self._epochs.due(checkpoint_id):
            root = self._epoch_dir(epoch)
            for staged in self._fs.find(root) if self._fs.exists(root) else []:
                name = staged[len(root) + 1:]
                if not name.rsplit("/", 1)[-1].startswith("."):
                    retried(f"parquet sink: publishing {staged}", lambda s=staged, t=f"{self._root}/{name}":
                            self._publish(s, t))
            self._clear(root)
            self._epochs.published(epoch)

    @serialized
    def abort(self, checkpoint_id: int) -> None:
        """Drop the files staged for ``checkpoint_id`` and later, and the open epoch's (the stream
        replays them). On a just-restored sink ``restore`` has done this already."""
        dropped = [e for c, e, _n in self._epochs.pending if c >= checkpoint_id] + [self._epochs.current]
        self._epochs.pending = [p for p in self._epochs.pending if p[0] < checkpoint_id]
        for epoch in dropped:
            self._clear(self._epoch_dir(epoch))
        self._epoch_files = 0

    # -- files ------------------------------------------------------------------------
    def _write(self, rows: list) -> None:
        """``rows`` as files of at most ``self.rows`` rows, per partition value."""
        groups: dict[Any, list] = {}
        for t in rows:
            groups.setdefault(t[self.partition_by] if self.partition_by else None, []).append(t)
        for value, part in groups.items():
            folder = "" if value is None else f"{self.partition_by}={value}"
            for i in range(0, len(part), self.rows):
                self._write_file(folder, part[i:i + self.rows])

    def _write_file(self, folder: str, rows: list) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.partition_by:
            rows = [{k: v for k, v in t.items() if k != self.partition_by} for t in rows]
        root = self._epoch_dir(self._epochs.current) if self._staged else self._root
        folder = f"{root}/{folder}" if folder else root
        table = pa.Table.from_pylist(rows)           # a row that does not fit fails here: a dead letter
        self.seq += 1
        self._epoch_files += 1
        name = f"part-{self._writer}-{self.seq:06d}.parquet"
        hidden, target = f"{folder}/.{name}.tmp", f"{folder}/{name}"

        def write() -> None:
            # A file that could not be written (a full or read-only disk) is removed and written
            # again, then the PE fails (DeliveryFailed): raised from ``process`` a plain OSError
            # made the batch dead letters while later checkpoints committed past the gap.
            try:
                self._fs.makedirs(folder, exist_ok=True)
                with self._fs.open(hidden, "wb") as f:
                    pq.write_table(table, f)
                self._publish(hidden, target)
            except OSError:
                with contextlib.suppress(OSError):
                    self._fs.rm(hidden)
                raise
        retried(f"parquet sink: writing {target}", write)

    def _publish(self, source: str, target: str) -> None:
        """Move a finished file to its name: a rename on a local disk; on an object store, which
        has no rename, a copy (an object appears whole) then the removal of the source. Names
        are fixed by ``seq``, so a move repeated after a crash writes the same file again."""
        if self._fs.exists(source):
            self._fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self._fs.mv(source, target)

    def _epoch_dir(self, epoch: int) -> str:
        return f"{self._staging}/e{epoch:010d}"

    def _clear(self, folder: str) -> None:
        if self._fs.exists(folder):
            self._fs.rm(folder, recursive=True)

    def _remove_files_after(self, seq: int) -> None:
        """Remove this writer's files numbered above ``seq``, published or staged, and staged
        epochs its bookkeeping does not know (written after the snapshot being restored)."""
        prefix = f"part-{self._writer}-"
        for path in self._fs.find(self._root) + self._fs.find(self._staging):
            f = path.rsplit("/", 1)[-1]
            if f.startswith(prefix) and f.endswith(".parquet") and int(f[len(prefix):-8]) > seq:
                self._fs.rm(path)
        for name in self._fs.ls(self._staging, detail=False) if self._fs.exists(self._staging) else []:
            epoch = epoch_of(name.rsplit("/", 1)[-1])
            if epoch is None or not self._epochs.known(epoch):
                self._clear(name)

"""What the table-format sinks (``delta``, ``iceberg``) share: Arrow buffering and idempotent commits.

Between two checkpoint barriers the rows a sink receives are one *epoch*,
kept as an Arrow table. ``pre_commit(id)`` seals it under ``id``: the sealed
tables are operator state, so the checkpoint itself holds them durably (as
Flink's table sinks keep their committables in checkpoint state).
``commit(id)`` makes one table commit per sealed epoch, tagged with the
writer's identity and the epoch's checkpoint id (Delta: an application
transaction ``txn``; Iceberg: snapshot properties). Before it commits, the
sink reads the last checkpoint id the table already holds for its writer,
so a commit replayed after a crash (recovery calls ``commit(n)`` again) is
a no-op: a row is never written twice. A commit that fails with a transient
error is tried again after a backoff (``pescheduler.sinks.retry.*``, asking the
table again each time), then fails the PE.

The writer's identity is the operator id and a token made when the sink
first opens, kept in its state: a restored sink goes on under the same
identity, a new deployment (whose checkpoint ids start again at 1) gets a
new one, so its commits are never taken for replays.
"""

from __future__ import annotations

import uuid
from typing import Any

from pescheduler.operator import Emitter, Sink

from .staging import retried, serialized


class TableSink(Sink):
    """Base of sinks that append Arrow tables to a table format, exactly once with checkpoints.

    Subclasses implement ``_committed()`` (the last checkpoint id the table
    holds for ``self.writer``, or ``None``) and ``_append(table, checkpoint_id)``
    (one table commit; ``checkpoint_id`` is ``None`` when not checkpointing).
    Without checkpoints a commit is made every ``rows`` rows and at the end.
    """

    columnar = True             # an Arrow batch is kept whole; rows are converted once per batch
    may_block = True            # retries a failed write or commit (staging.retried)

    def __init__(self, partition_by: str | list[str] | None = None, rows: int = 1_000_000) -> None:
        self.partition_by = [partition_by] if isinstance(partition_by, str) else list(partition_by or [])
        self.rows = int(rows)
        self._open_rows: list = []              # Arrow tables of the open epoch
        self._sealed: list = []                 # [checkpoint id, Arrow table] waiting for its checkpoint
        self._staged = False
        self._last_id = 0                       # the highest checkpoint id sealed
        self._token: str | None = None

    def open(self, context: Any) -> None:
        super().open(context)
        self._token = self._token or uuid.uuid4().hex[:12]
        self.writer = f"pescheduler:{context.op_id}:{self._token}"
        self._staged = self._staged or bool(context.extra.get("checkpoint"))

    @serialized
    def process(self, batch: Any, emit: Emitter) -> None:
        import pyarrow as pa

        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else pa.Table.from_pylist(batch)
        self._open_rows.append(table)
        if not self._staged and sum(map(len, self._open_rows)) >= self.rows:
            self._append(self._take_open(), None)

    def _take_open(self) -> Any:
        """The open epoch's rows as one table (dictionary columns decoded: table formats store values)."""
        import pyarrow as pa

        tables, self._open_rows = self._open_rows, []
        table = pa.concat_tables(tables, promote_options="permissive")
        return table.cast(pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                                     for f in table.schema]))

    # -- two-phase commit --------------------------------------------------------------
    @serialized
    def pre_commit(self, checkpoint_id: float) -> None:
        """Seal the rows since the last barrier under ``checkpoint_id`` (held in the snapshot)."""
        self._staged = True
        if checkpoint_id == float("inf"):       # the end of the stream: the id after the last one
            checkpoint_id = self._last_id + 1
        self._last_id = max(self._last_id, int(checkpoint_id))
        if self._open_rows:
            self._sealed.append([int(checkpoint_id), self._take_open()])

    @serialized
    def commit(self, checkpoint_id: float) -> None:
        """One table commit per sealed epoch up to ``checkpoint_id``, oldest first, skipping those
        the table already holds for this writer (a replay). An epoch leaves the state only once
        committed, so a commit that fails half-way is finished by the next one."""
        for entry in [p for p in self._sealed if p[0] <= checkpoint_id]:
            retried(f"{self.name} sink: committing checkpoint {entry[0]} to {self._target()}",
                    lambda entry=entry: self._commit_epoch(*entry), self._transient())
            self._sealed.remove(entry)

    def _commit_epoch(self, checkpoint_id: int, table: Any) -> None:
        """One epoch's table commit, unless the table holds it already: asked again on every try,
        so a retry after a commit that landed but answered with an error writes nothing twice."""
        done = self._committed()
        if done is None or checkpoint_id > done:
            self._append(table, checkpoint_id)

    @serialized
    def abort(self, checkpoint_id: int) -> None:
        """Drop the epochs sealed for ``checkpoint_id`` and later and the open one (replayed)."""
        self._sealed = [p for p in self._sealed if p[0] < checkpoint_id]
        self._open_rows = []

    @serialized
    def flush(self, emit: Emitter) -> None:
        """End of stream: everything received is committed (the stream's last checkpoint)."""
        if self._staged:
            self.pre_commit(float("inf"))
            self.commit(float("inf"))
        elif self._open_rows:
            self._append(self._take_open(), None)

    @serialized
    def snapshot(self) -> dict:
        return {"token": self._token, "staged": self._staged, "last": self._last_id,
                "sealed": [list(p) for p in self._sealed], "open": list(self._open_rows)}

    def restore(self, state: dict | None) -> None:
        if state:
            self._token, self._staged, self._last_id = state["token"], state["staged"], state["last"]
            self._sealed, self._open_rows = [list(p) for p in state["sealed"]], list(state["open"])

    # -- the table format ------------------------------------------------------------
    def _transient(self) -> tuple:
        """The errors a commit is tried again after (a storage blip, a concurrent writer's conflict)."""
        return (OSError,)

    def _target(self) -> str:
        """The table, as error messages name it."""
        raise NotImplementedError

    def _committed(self) -> int | None:
        raise NotImplementedError

    def _append(self, table: Any, checkpoint_id: int | None) -> None:
        raise NotImplementedError

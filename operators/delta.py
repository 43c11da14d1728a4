"""The ``delta`` sink: a Delta Lake table at any URL delta-rs reaches, one commit per checkpoint.

Each commit carries an application transaction (the Delta protocol's ``txn``
action: app id = the sink's writer identity, version = the checkpoint id),
written atomically with the data files in the same log entry. Before a
commit the sink asks the table for its writer's last version
(``DeltaTable.transaction_version``), so a replayed commit writes nothing.
"""

from __future__ import annotations

from typing import Any

from .table_sink import TableSink


class DeltaSink(TableSink):
    """Append to the Delta table at ``path``: ``app.sink("delta", path="s3://lake/cars", partition_by="car")``.

    The table is created by the first commit (schema from the first rows,
    partitioned by ``partition_by``); later commits append. ``storage_options``
    go to delta-rs (object-store credentials). Without checkpoints a commit is
    made every ``rows`` rows and at the end of the stream (at-least-once).
    """

    name = "delta"
    requires = ("deltalake", "pyarrow")
    install = "pescheduler[lakehouse]"

    def __init__(self, path: str, partition_by: str | list[str] | None = None, rows: int = 1_000_000,
                 storage_options: dict | None = None) -> None:
        super().__init__(partition_by=partition_by, rows=rows)
        self.path = str(path)
        self.storage_options = storage_options

    def _target(self) -> str:
        return self.path

    def _transient(self) -> tuple:
        from deltalake.exceptions import CommitFailedError

        return (OSError, CommitFailedError)     # a storage blip; another writer's commit won the race

    def _committed(self) -> int | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.path, storage_options=self.storage_options).transaction_version(self.writer)
        except TableNotFoundError:
            return None

    def _append(self, table: Any, checkpoint_id: int | None) -> None:
        from deltalake import CommitProperties, Transaction, write_deltalake

        txn = [] if checkpoint_id is None else [Transaction(self.writer, int(checkpoint_id))]
        write_deltalake(self.path, table, mode="append", partition_by=self.partition_by or None,
                        storage_options=self.storage_options,
                        commit_properties=CommitProperties(app_transactions=txn))

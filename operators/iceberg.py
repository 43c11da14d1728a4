"""The ``iceberg`` sink: an Apache Iceberg table through pyiceberg, one snapshot per checkpoint.

Each snapshot's summary carries ``pescheduler.writer`` (the sink's writer
identity) and ``pescheduler.checkpoint`` (the checkpoint id), committed
atomically with the data by the catalog's metadata swap. Before a commit the
sink reads the largest checkpoint id of its writer among the table's
snapshots, so a replayed commit adds nothing. (Expiring snapshots keeps the
newest ones, which are the ones that answer.)
"""

from __future__ import annotations

from typing import Any

from .table_sink import TableSink

WRITER, CHECKPOINT = "pescheduler.writer", "pescheduler.checkpoint"


class IcebergSink(TableSink):
    """Append to the Iceberg table ``table`` (``"namespace.name"``) of the catalog ``catalog``.

    ``catalog``: pyiceberg catalog properties, e.g. the embedded SQL catalog
    ``{"type": "sql", "uri": "sqlite:///lake/catalog.db", "warehouse": "file:///lake/warehouse"}``
    or a REST catalog ``{"type": "rest", "uri": "http://..."}``; ``catalog_name``
    names it. The namespace and table are created by the first commit when
    missing (schema from the first rows; identity partitions on ``partition_by``).
    Without checkpoints a snapshot is made every ``rows`` rows and at the end.
    """

    name = "iceberg"
    requires = ("pyiceberg", "pyarrow")
    install = "pescheduler[lakehouse]"

    @staticmethod
    def writes(params: dict) -> list[str]:
        """What it writes, for the one-writer check at deploy (``plan/outputs.py``): the table in a
        SQLite catalog's file, ``<catalog file>/<namespace.name>`` (two deployments appending to one
        table commit over each other's snapshots; other tables of that catalog are free). A catalog
        on a server is not a local path: not checked."""
        uri, table = (params.get("catalog") or {}).get("uri"), params.get("table")
        if not isinstance(uri, str) or not uri.startswith("sqlite:///") or not isinstance(table, str):
            return []
        return [f"{uri[len('sqlite:///'):]}/{table}"]

    def __init__(self, catalog: dict, table: str, partition_by: str | list[str] | None = None,
                 rows: int = 1_000_000, catalog_name: str = "default") -> None:
        super().__init__(partition_by=partition_by, rows=rows)
        if "." not in table:
            raise ValueError(f"iceberg sink: table must be 'namespace.name', got {table!r}")
        self.catalog, self.table, self.catalog_name = dict(catalog), table, catalog_name
        self._table = None

    def _target(self) -> str:
        return f"{self.catalog_name}.{self.table}"

    def _transient(self) -> tuple:
        from pyiceberg.exceptions import CommitFailedException

        transient = [OSError, CommitFailedException]   # a storage blip; another writer's commit won the race
        try:        # a SQL catalog's database: locked, unreachable, or its own tables made by another
            from sqlalchemy.exc import OperationalError    # process at the same moment ("already exists")

            transient.append(OperationalError)
        except ImportError:                         # no SQL catalog without SQLAlchemy
            pass
        return tuple(transient)

    def _load(self, schema: Any = None) -> Any:
        """The table, loaded once (created from ``schema`` when missing and a schema is given)."""
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        if self._table is None:
            catalog = load_catalog(self.catalog_name, **self.catalog)
            try:
                self._table = catalog.load_table(self.table)
            except NoSuchTableError:
                if schema is None:
                    return None
                self._table = self._create(catalog, schema)
        return self._table

    def _create(self, catalog: Any, schema: Any) -> Any:
        catalog.create_namespace_if_not_exists(self.table.rsplit(".", 1)[0])
        table = catalog.create_table_if_not_exists(self.table, schema=schema)
        if self.partition_by and table.spec().is_unpartitioned():
            with table.update_spec() as spec:
                for name in self.partition_by:
                    spec.add_identity(name)
        return table

    def _committed(self) -> int | None:
        table = self._load()
        if table is None:
            return None
        table.refresh()
        ids = [int(s.summary[CHECKPOINT]) for s in table.metadata.snapshots
               if s.summary is not None and s.summary[WRITER] == self.writer]
        return max(ids, default=None)

    def _append(self, table: Any, checkpoint_id: int | None) -> None:
        target = self._load(table.schema)
        tags = {} if checkpoint_id is None else {WRITER: self.writer, CHECKPOINT: str(checkpoint_id)}
        target.append(table, snapshot_properties=tags)

"""The ``postgres_cdc`` source: a PostgreSQL table's inserts, updates and deletes as a stream.

Changes come from a logical replication slot with the ``pgoutput`` plug-in
(built into the server, so no extension to install; ``wal2json`` is not in
Debian's server package and ``test_decoding``'s text is not meant to be parsed),
read through ``pg_logical_slot_peek_binary_changes``: psycopg has no client for
the streaming replication protocol, and the slot SQL functions need none.

**Snapshot, then changes, no gap, no overlap.** The publication, then the slot,
are created first (a publication must exist before the WAL it decodes). The
snapshot transaction (``REPEATABLE READ``) then takes ``LOCK TABLE ... IN SHARE
MODE`` on the tables: writers in flight finish first (their locks last until
their commit is visible), new ones wait. Its first query reads
``pg_current_wal_insert_lsn()`` = *S* and fixes the snapshot: every change of
the tables committed before *S* is in it, every later one commits after *S*.
The snapshot's rows are emitted, then the slot's transactions ending after *S*.

**Position and the slot.** The position is ``{"lsn": end LSN of the last
transaction emitted}`` (whole transactions are emitted at once). Peeking does not
consume: the slot's confirmed LSN advances (``pg_replication_slot_advance``)
only in ``commit(id)``, once checkpoint ``id``, whose barrier recorded the LSN
(``pre_commit``), is complete, so a restore from any complete checkpoint still
finds its changes in the slot. A checkpoint while the snapshot is read fails
(a snapshot cannot be resumed); the first one after it covers it.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from pescheduler.errors import NotReplayable
from pescheduler.operator import CommitHooks, Source

from .pgoutput import Begin, Change, Commit, Decoder, Truncate

# Rows a peek fetches past those already read: each peek makes the server decode again from the slot's
# confirmed LSN, so larger peeks mean fewer repeated server decodes between two checkpoints (whole
# transactions always come). The rows already read are skipped by the server (OFFSET): never sent, and
# never decoded again in Python (which, decoding the whole prefix each peek, cost 3x the work at 10,000).
PEEK_ROWS = 50_000
PEEK = ("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, 'proto_version', '1', "
        "'publication_names', %s) OFFSET %s")


class PostgresCdcSource(Source, CommitHooks):
    """Changes of PostgreSQL tables: ``app.source("postgres_cdc", dsn=URL, tables=["orders"])``.

    Each change is ``{"op": "insert"|"update"|"delete", "table", <key columns>,
    "before"?, "after", "lsn", "ts"}``: ``after`` the new row (``None`` for a
    delete), ``before`` the old key (the old row under ``REPLICA IDENTITY
    FULL``) for deletes and key-changing updates, ``lsn`` the end of its
    transaction in the WAL, ``ts`` its commit time in ms (the event time). With
    ``snapshot=True`` the rows the tables hold come first, as inserts at the
    snapshot's LSN. ``slot`` and ``publication`` are created when missing
    (``create_slot=True``); a lost connection is opened again with backoff,
    ``retries`` times, then the source fails naming the error. The server needs
    ``wal_level=logical``.
    """

    name = "postgres_cdc"
    requires = ("psycopg",)
    install = "pescheduler[postgres]"

    def __init__(self, dsn: str, tables: list[str], slot: str = "pescheduler", publication: str = "pescheduler",
                 snapshot: bool = True, create_slot: bool = True, retries: int = 8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not tables:
            raise ValueError("postgres_cdc: tables=[...] names at least one table")
        self.dsn, self.tables, self.slot, self.publication = dsn, list(tables), slot, publication
        self.read_snapshot, self.create_slot, self.retries = snapshot, create_slot, retries
        self._lsn: int | None = None                # end LSN of the last transaction emitted
        self._barriers: dict[int, int] = {}         # checkpoint id -> the LSN its barrier recorded
        self._skip = 0                              # peeked rows at or before _lsn, from the slot's start
        self._ready: deque = deque()                # changes decoded, not yet returned
        self._conn = self._snapshot_rows = None

    # -- opening -------------------------------------------------------------------
    def open(self, context: Any) -> None:
        super().open(context)
        self._checkpointed = bool(context is not None and context.extra.get("checkpoint"))
        self._conn = self._connect()
        self._decoder = Decoder(self._loader)
        self._check_wal_level()
        self._ensure_slot()
        if self._lsn is None:
            self._start(self.read_snapshot)

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def _check_wal_level(self) -> None:
        (level,) = self._conn.execute("SHOW wal_level").fetchone()
        if level != "logical":
            raise RuntimeError(f"postgres_cdc: the server has wal_level={level}; change data capture needs "
                               f"wal_level=logical: set it in postgresql.conf (or ALTER SYSTEM SET "
                               f"wal_level = logical) and restart the server")

    def _ensure_slot(self) -> None:
        """The publication, then the slot (pgoutput needs the publication to exist in the WAL it decodes)."""
        conn = self._conn
        if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [self.publication]).fetchone():
            conn.execute(f"CREATE PUBLICATION {_ident(self.publication)} FOR TABLE "
                         f"{', '.join(_ident(t) for t in self.tables)} WITH (publish = 'insert, update, delete')")
        if conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [self.slot]).fetchone():
            return
        if not self.create_slot:
            raise RuntimeError(f"postgres_cdc: replication slot {self.slot!r} does not exist (create_slot=False)")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [self.slot])

    def _start(self, snapshot: bool) -> None:
        """Where a fresh source starts: after the snapshot it reads now, or at the WAL's end without one.
        The tables are locked only until the reading transaction has its snapshot."""
        import psycopg

        reader = psycopg.connect(self.dsn)
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with self._conn.transaction():
            self._conn.execute(f"LOCK TABLE {', '.join(_ident(t) for t in self.tables)} IN SHARE MODE")
            (lsn, now), = reader.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, "
                                         "(extract(epoch FROM now()) * 1000)::bigint").fetchall()
        self._lsn, self._snapshot_ts = int(lsn), int(now)
        if snapshot:
            self._snapshot_rows = self._read_tables(reader)
        else:
            reader.close()

    def _read_tables(self, reader: Any) -> Any:
        """The tables' rows in the snapshot, one batch at a time (a server-side cursor each)."""
        from psycopg.rows import dict_row

        for table in self.tables:
            key = self._primary_key(table)
            with reader.cursor(name="pescheduler_snapshot", row_factory=dict_row) as cursor:
                cursor.execute(f"SELECT * FROM {_ident(table)}")
                while rows := cursor.fetchmany(1000):
                    yield [self._row(table, key, row) for row in rows]
        reader.close()

    def _primary_key(self, table: str) -> list[str]:
        return [name for (name,) in self._conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary", [table])]

    def _row(self, table: str, key: list[str], row: dict) -> dict:
        return {"op": "insert", "table": table, **{k: row[k] for k in key}, "after": row,
                "lsn": self._lsn, "ts": self._snapshot_ts}

    def _loader(self, type_oid: int) -> Any:
        """How psycopg loads a column of this type from text (text itself when it knows no loader)."""
        from psycopg.pq import Format

        cls = self._conn.adapters.get_loader(type_oid, Format.TEXT)
        return cls(type_oid, self._conn).load if cls else _text

    # -- reading -------------------------------------------------------------------
    def read(self, n: int) -> list:
        if self._snapshot_rows is not None:
            batch = next(self._snapshot_rows, None)
            if batch is not None:
                return batch
            self._snapshot_rows = None
        if not self._ready:
            self._peek(n)
        return [self._ready.popleft() for _ in range(len(self._ready))]

    def _peek(self, n: int) -> None:
        """Decode the transactions after ``_lsn``: the slot replays from its confirmed LSN, so the server
        skips the ``_skip`` rows up to the last transaction read (the same rows each time: the slot's
        output from one position is deterministic, new commits only come after them). A transaction
        longer than the peek doubles it until its commit comes."""
        more = max(n, PEEK_ROWS)
        while True:
            skip, limit = self._skip, self._skip + more
            rows = self._retrying(lambda: self._conn.execute(
                PEEK, [self.slot, limit, self.publication, skip]).fetchall())
            emitted = self._decode(rows, skip)
            if emitted and not self._checkpointed:
                self._advance(self._lsn)            # nothing will be replayed: the slot need not keep it
            if emitted or len(rows) < more:
                return
            more *= 2

    def _decode(self, rows: list, skip: int) -> bool:
        """Queue the changes of every whole transaction after ``_lsn`` in ``rows`` (the slot's output
        after its first ``skip`` rows); True if there was one."""
        txn: list = []
        ts, seen, emitted = 0, 0, False
        decode = self._decoder.decode
        for i, (data,) in enumerate(rows, 1):
            message = decode(data)
            if isinstance(message, Begin):
                txn, ts = [], message.commit_ts_ms
            elif isinstance(message, (Change, Truncate)):
                txn.append(message)
            elif isinstance(message, Commit):
                seen = i
                if message.end_lsn > self._lsn:
                    self._emit(txn, ts, message.end_lsn)
                    emitted = True
        self._skip = skip + seen
        return emitted

    def _emit(self, txn: list, ts: int, lsn: int) -> None:
        """Queue a transaction's changes as dicts (once per change: one dict built in place)."""
        append = self._ready.append
        for change in txn:
            if isinstance(change, Truncate):
                self.reject({"truncate": change.tables, "lsn": lsn},
                            f"postgres_cdc: TRUNCATE of {', '.join(change.tables)} is not a change per row")
                continue
            op, relation, before, after = change
            row = after if after is not None else before
            record = {"op": op, "table": relation.table}
            for k in relation.key:
                record[k] = row.get(k)
            if before is not None:
                record["before"] = before
            record["after"], record["lsn"], record["ts"] = after, lsn, ts
            append(record)
        self._lsn = lsn

    def _retrying(self, query: Any) -> Any:
        """Run ``query``; a lost connection is opened again after 0.1, 0.2, 0.4 ... s (at most 5 s),
        ``retries`` times, then the error is raised naming the slot."""
        import psycopg

        for attempt in range(self.retries + 1):
            try:
                return query()
            except psycopg.OperationalError as exc:
                if attempt == self.retries:
                    raise RuntimeError(f"postgres_cdc: slot {self.slot!r}: the server stayed unreachable "
                                       f"after {self.retries} retries: {exc}") from exc
                time.sleep(min(0.1 * 2 ** attempt, 5.0))
                self._reconnect()

    def _reconnect(self) -> None:
        try:
            self._conn.close()
            self._conn = self._connect()
        except Exception:
            pass                                    # still down: the next attempt tries again

    # -- checkpoints ---------------------------------------------------------------
    def position(self) -> dict:
        if self._snapshot_rows is not None:
            raise NotReplayable(f"postgres_cdc: slot {self.slot!r} is reading its initial snapshot, which "
                                f"cannot be resumed: the first checkpoint after it covers it")
        return {"lsn": self._lsn}

    def seek(self, position: dict) -> None:
        self._lsn = int(position["lsn"])
        self._snapshot_rows, self._skip = None, 0
        self._ready.clear()

    def pre_commit(self, checkpoint_id: int) -> None:
        if self._lsn is not None:
            self._barriers[checkpoint_id] = self._lsn

    def commit(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: the slot may drop what its barrier had read."""
        covered = [lsn for cid, lsn in self._barriers.items() if cid <= checkpoint_id]
        if not covered:
            return
        self._barriers = {cid: lsn for cid, lsn in self._barriers.items() if cid > checkpoint_id}
        self._advance(max(covered))

    def _advance(self, lsn: int) -> None:
        """Move the slot's confirmed LSN up to ``lsn`` (never back): the server may drop the WAL before."""
        self._retrying(lambda: self._conn.execute(
            "SELECT pg_replication_slot_advance(slot_name, '0/0'::pg_lsn + %s::numeric) FROM pg_replication_slots "
            "WHERE slot_name = %s AND confirmed_flush_lsn < '0/0'::pg_lsn + %s::numeric",
            [lsn, self.slot, lsn]).fetchall())
        self._skip = 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _text(data: bytes) -> str:
    return bytes(data).decode()


def _ident(name: str) -> str:
    """A (schema-qualified) name quoted as an SQL identifier."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


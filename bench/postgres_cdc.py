"""Postgres change-data-capture benchmark: the postgres_cdc source against a bare slot loop.

    python bench/postgres_cdc.py [--rows 200000] [--quick]

A server of its own (tests/pg_server.py: Debian's package, a temp cluster, wal_level=logical)
gets ``--rows`` inserts, then an update of every row, in transactions of 10,000 rows. Two
slots see the same WAL:

  bare:        ``pg_logical_slot_get_binary_changes`` (pgoutput) in a loop, 10,000 rows a
               call, consuming the slot; the bytes are fetched, not decoded in Python
               (the baseline: what the server costs alone)
  postgres_cdc: the source's ``read`` until every change came (decoded to dicts, typed by
               psycopg's loaders), its slot advanced by ``commit`` every 50,000 changes as
               completed checkpoints would

The source's output is checked: every insert and update once, in order of their ids per
transaction. Then ``--snapshot-rows`` (default ``--rows``) rows in a second table are read
as the source's initial snapshot (``snapshot=True``) followed by an update of every row made
after it, against a bare ``SELECT *`` of the same table (rows fetched as tuples): rows/s of the
snapshot, changes/s after it, each change once. Loaded-machine figures (L): compare the
ratio, not the times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

BATCH = 10_000
BARE = ("SELECT data FROM pg_logical_slot_get_binary_changes('bare', NULL, %s, 'proto_version', '1', "
        "'publication_names', 'bench')")


def fill(conn, rows: int) -> None:
    for start in range(1, rows + 1, BATCH):
        conn.execute("INSERT INTO t SELECT i, 'x' || i FROM generate_series(%s::int, %s::int) i",
                     [start, min(start + BATCH - 1, rows)])
    for start in range(1, rows + 1, BATCH):
        conn.execute("UPDATE t SET v = v || 'y' WHERE id BETWEEN %s AND %s", [start, start + BATCH - 1])


def through_source(source, changes: int) -> tuple[float, list]:
    got, t0, checkpoint = [], time.perf_counter(), 0
    while len(got) < changes:
        got.extend(source.read(1000))
        if len(got) // 50_000 > checkpoint:
            checkpoint += 1
            source.pre_commit(checkpoint)
            source.commit(checkpoint)
    return time.perf_counter() - t0, got


def snapshot_then_changes(conn, url: str, rows: int) -> None:
    """The initial snapshot of a ``rows``-row table, then an update of every row made after it."""
    from pescheduler.operator import OperatorContext
    from pescheduler.operators import PostgresCdcSource

    conn.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
    for start in range(1, rows + 1, BATCH):
        conn.execute("INSERT INTO s SELECT i, 'x' || i FROM generate_series(%s::int, %s::int) i",
                     [start, min(start + BATCH - 1, rows)])
    t0 = time.perf_counter()
    selected = len(conn.execute("SELECT * FROM s").fetchall())
    t_select = time.perf_counter() - t0
    source = PostgresCdcSource(dsn=url, tables=["s"], slot="snap", publication="bench_s", snapshot=True)
    t0 = time.perf_counter()
    source.open(OperatorContext("postgres_cdc-2", extra={"checkpoint": True}))
    t_open = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = []
    while len(got) < rows:                     # the snapshot (no checkpoint completes while it is read)
        got.extend(source.read(1000))
    t_snapshot = time.perf_counter() - t0
    for start in range(1, rows + 1, BATCH):
        conn.execute("UPDATE s SET v = v || 'z' WHERE id BETWEEN %s AND %s", [start, start + BATCH - 1])
    conn.execute("SELECT pg_switch_wal()")
    t_changes, changes = through_source(source, rows)
    source.close()
    if (sorted(c["id"] for c in got) != list(range(1, rows + 1)) or selected != rows
            or sorted((c["op"], c["id"]) for c in changes) != [("update", i) for i in range(1, rows + 1)]):
        sys.exit("postgres_cdc snapshot or the changes after it differ from the table")
    print(f"snapshot of {rows:,} rows, then {rows:,} updates, output checked: each row and change once")
    print(f"bare SELECT *           {rows / t_select:>10,.0f} rows/s     {t_select:6.2f} s")
    print(f"postgres_cdc snapshot   {rows / t_snapshot:>10,.0f} rows/s     {t_snapshot:6.2f} s"
          f"   ratio {t_select / t_snapshot:.2f}x   (after open: slot, publication, lock, {t_open:.2f} s)")
    print(f"changes after it        {rows / t_changes:>10,.0f} changes/s  {t_changes:6.2f} s")


def bare(conn) -> tuple[float, int]:
    messages, t0 = 0, time.perf_counter()
    while rows := conn.execute(BARE, [BATCH]).fetchall():
        messages += len(rows)
    return time.perf_counter() - t0, messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--snapshot-rows", type=int, help="rows of the snapshot part (default: --rows)")
    parser.add_argument("--quick", action="store_true", help="20,000 rows")
    args = parser.parse_args()
    rows = 20_000 if args.quick else args.rows
    import psycopg

    from pg_server import running
    from pescheduler.operator import OperatorContext
    from pescheduler.operators import PostgresCdcSource

    with running() as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        source = PostgresCdcSource(dsn=url, tables=["t"], slot="cdc", publication="bench", snapshot=False)
        source.open(OperatorContext("postgres_cdc-1", extra={"checkpoint": True}))
        conn.execute("SELECT pg_create_logical_replication_slot('bare', 'pgoutput')")
        fill(conn, rows)
        conn.execute("SELECT pg_switch_wal()")      # flush: the slot functions read flushed WAL only
        time.sleep(1)
        t_bare, messages = bare(conn)
        t_source, got = through_source(source, 2 * rows)
        source.close()
        snapshot_then_changes(conn, url, 20_000 if args.quick else args.snapshot_rows or rows)
    expected = [("insert", i) for i in range(1, rows + 1)] + [("update", i) for i in range(1, rows + 1)]
    if sorted((c["op"], c["id"]) for c in got) != sorted(expected) or len(got) != len(expected):
        sys.exit("postgres_cdc output differs from the changes made")
    print(f"changes: {2 * rows:,} ({messages:,} pgoutput messages), output checked: each change once")
    print(f"bare get_changes loop   {2 * rows / t_bare:>10,.0f} changes/s  {t_bare:6.2f} s")
    print(f"postgres_cdc source     {2 * rows / t_source:>10,.0f} changes/s  {t_source:6.2f} s")
    print(f"ratio source/bare: {t_bare / t_source:.2f}x (L)   load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

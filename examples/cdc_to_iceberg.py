"""CDC to Iceberg: a PostgreSQL table's changes, its current rows per key, totals per region, in Iceberg.

    export PG_DSN=postgresql://postgres@localhost/postgres   # wal_level = logical
    python examples/cdc_to_iceberg.py setup      # the table shop_orders, 1,000 rows in 4 regions
    python -m pescheduler deploy examples/cdc_to_iceberg.py --checkpoint out/ckpt --duration 60 &
    python examples/cdc_to_iceberg.py change     # updates (some move a row to another region), deletes
    wait
    python examples/cdc_to_iceberg.py check      # Iceberg's current totals == the table's GROUP BY

The pipeline is three lines (``build``): the ``postgres_cdc`` source (a snapshot of the table,
then its changes), ``key_by("id").latest()`` (the current row per order, each change with the
row it replaced) and ``aggregate(..., by="region")``, which adds a new row's values and takes
an updated or deleted row's old values back out, emitting what each region's totals became.
The rows are appended to the Iceberg table ``shop.region_totals`` of a SQLite catalog under
``out/``, one snapshot per checkpoint (exactly once); a region's current totals are its row of
the highest ``version``, a region whose last order went has a ``delete`` row there. ``check``
reads the table back with pyiceberg, compares it with PostgreSQL's own ``GROUP BY`` and drops
the replication slot (a slot keeps WAL on the server until it is dropped).
"""

import os
import shutil
import sys
from pathlib import Path

from pescheduler import Application

OUT = Path("out").resolve()
SLOT = "cdc_to_iceberg"
TABLE = "shop.region_totals"
CATALOG = {"type": "sql", "uri": f"sqlite:///{OUT}/catalog.db", "warehouse": f"file://{OUT}/warehouse"}
AGGREGATES = {"orders": "count", "amount": ("sum", "amount"), "biggest": ("max", "amount")}


def build() -> Application:
    app = Application("cdc-to-iceberg")
    orders = app.source("postgres_cdc", dsn=os.environ["PG_DSN"], tables=["shop_orders"], slot=SLOT, publication=SLOT)
    totals = orders.key_by("id").latest().aggregate(AGGREGATES, by="region")
    totals.sink("iceberg", catalog=CATALOG, table=TABLE)
    return app


def setup(db) -> None:
    """A fresh table of 1,000 orders; an old run's slot, publication and out/ (catalog, checkpoints) removed."""
    if db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [SLOT]).fetchone():
        db.execute("SELECT pg_drop_replication_slot(%s)", [SLOT])
    db.execute(f"DROP PUBLICATION IF EXISTS {SLOT}")
    db.execute("DROP TABLE IF EXISTS shop_orders")
    db.execute("CREATE TABLE shop_orders (id int PRIMARY KEY, region text, amount int)")
    db.execute("INSERT INTO shop_orders SELECT i, 'r' || (i % 4), i % 97 FROM generate_series(1, 1000) i")
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()


def change(db) -> None:
    """Updates, rows moved to another region, deletes that empty region r3 and a new region."""
    db.execute("UPDATE shop_orders SET amount = amount * 2 WHERE id % 3 = 0")
    db.execute("UPDATE shop_orders SET region = 'r9' WHERE id % 7 = 0")
    db.execute("DELETE FROM shop_orders WHERE id % 5 = 0 OR region = 'r3'")
    db.execute("UPDATE shop_orders SET amount = 0 WHERE amount = (SELECT max(amount) FROM shop_orders)")


def current_totals() -> dict:
    """Each region's row of the highest version in the Iceberg table; deleted regions left out."""
    from pyiceberg.catalog import load_catalog

    rows = load_catalog("default", **CATALOG).load_table(TABLE).scan().to_arrow().to_pylist()
    last: dict = {}
    for row in rows:
        if row["version"] > last.get(row["region"], {"version": 0})["version"]:
            last[row["region"]] = row
    return {g: (r["orders"], r["amount"], r["biggest"]) for g, r in last.items() if r["op"] == "upsert"}


def check(db) -> bool:
    expected = {g: (n, total, hi) for g, n, total, hi in db.execute(
        "SELECT region, count(*), sum(amount), max(amount) FROM shop_orders GROUP BY region")}
    got = current_totals()
    print("iceberg:", dict(sorted(got.items())))
    print("postgres:", dict(sorted(expected.items())))
    print("equal to the table's GROUP BY:", got == expected)
    db.execute("SELECT pg_drop_replication_slot(%s)", [SLOT])
    return got == expected


if __name__ == "__main__":
    import psycopg

    step = {"setup": setup, "change": change, "check": check}[sys.argv[1]]
    with psycopg.connect(os.environ["PG_DSN"], autocommit=True) as connection:
        sys.exit(0 if step(connection) is not False else 1)

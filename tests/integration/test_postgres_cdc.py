"""Issue 32: a PostgreSQL table's changes as a stream, against Debian's real server (tests/pg_server.py).

The source is driven by hand for the exact contract (snapshot then changes, no gap, no overlap;
the slot advanced only by a completed checkpoint; a missing slot created; wal_level refused),
and deployed on a real cluster whose source worker is SIGKILLed mid-stream: every change lands
exactly once in the checkpointed jsonl sink.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

import pescheduler
from pescheduler import Application, Replicate
from pescheduler.operator import OperatorContext
from pescheduler.operators import PostgresCdcSource
from pg_server import running
from waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.database]

WAIT = 60                      # a bound on every wait
DOC = Path(__file__).parent.parent.parent / "docs" / "connectors.md"


@pytest.fixture(scope="module")
def server():
    with running() as url:
        yield url


@pytest.fixture
def db(server, request):
    """A fresh database of the test's own on the module's server (slots are per database)."""
    name = "t_" + request.node.name.lower()[:40].replace("[", "_").replace("]", "")
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = server.replace("/postgres?", f"/{name}?")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric, note text)")
        yield url, conn
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", [name]):
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])


def opened(url, checkpointed: bool = True, **params) -> PostgresCdcSource:
    """A source opened as a deployment with checkpoints (or without) opens it."""
    source = PostgresCdcSource(dsn=url, tables=["orders"], slot="s", publication="p", **params)
    source.open(OperatorContext("postgres_cdc-1", extra={"checkpoint": checkpointed}))
    return source


def reading_changes(url, conn, count: int) -> PostgresCdcSource:
    """A source without a snapshot that has read the inserts of rows 1..count."""
    source = opened(url, snapshot=False)
    conn.execute("INSERT INTO orders SELECT i, 0, '' FROM generate_series(1, %s) i", [count])
    assert len(read_until(source, count)) == count
    return source


def read_until(source, count: int) -> list[dict]:
    """Read until ``count`` changes came (the server makes WAL readable once flushed: a bounded wait)."""
    got: list[dict] = []
    until(lambda: got.extend(source.read(100) or []) or len(got) >= count, WAIT, f"{count} changes")
    return got


def test_snapshot_then_changes_exact_and_a_missing_slot_is_created(db):
    url, conn = db
    conn.execute("INSERT INTO orders SELECT i, i * 1.5, 'n' || i FROM generate_series(1, 2500) i")
    source = opened(url)
    assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 's'").fetchone() == (1,)
    snap = read_until(source, 2500)
    assert sorted(r["id"] for r in snap) == list(range(1, 2501))
    assert {r["op"] for r in snap} == {"insert"} and snap[0]["after"]["note"] == f"n{snap[0]['id']}"
    conn.execute("INSERT INTO orders VALUES (3000, 7.25, 'new')")
    conn.execute("UPDATE orders SET amount = 9 WHERE id = 1")
    conn.execute("UPDATE orders SET id = 4000 WHERE id = 2")
    conn.execute("DELETE FROM orders WHERE id = 3")
    changes = read_until(source, 4)
    assert [(c["op"], c["id"]) for c in changes] == [("insert", 3000), ("update", 1), ("update", 4000),
                                                     ("delete", 3)]
    assert str(changes[0]["after"]["amount"]) == "7.25" and changes[1]["after"]["amount"] == 9
    assert changes[2]["before"] == {"id": 2} and changes[3] == {**changes[3], "before": {"id": 3}, "after": None}
    assert all(c["table"] == "orders" and c["ts"] > 1.7e12 for c in changes)
    assert [c["lsn"] for c in changes] == sorted(c["lsn"] for c in changes) and changes[0]["lsn"] > snap[0]["lsn"]
    source.close()


def test_writes_during_the_snapshot_are_in_it_or_after_it_never_both(db):
    url, conn = db
    conn.execute("INSERT INTO orders SELECT i, 0, '' FROM generate_series(1, 200) i")
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(url, autocommit=True) as writer:
            i = 1000
            while not stop.is_set():
                writer.execute("INSERT INTO orders VALUES (%s, 0, '')", [i])
                i += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        until(lambda: conn.execute("SELECT count(*) FROM orders").fetchone()[0] > 400, WAIT, "writes")
        source = opened(url)
        until(lambda: conn.execute("SELECT count(*) FROM orders").fetchone()[0] > 1200, WAIT, "more writes")
    finally:
        stop.set()
        thread.join(WAIT)
    total = conn.execute("SELECT count(*) FROM orders").fetchone()[0]
    ids = [r["id"] for r in read_until(source, total)]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == total       # each row once: no gap, no overlap
    source.close()


def test_the_slot_advances_only_when_a_checkpoint_completes_and_seek_resumes(db):
    url, conn = db
    source = reading_changes(url, conn, 10)
    source.pre_commit(1)
    at_barrier = source.position()
    conn.execute("INSERT INTO orders SELECT i, 0, '' FROM generate_series(11, 15) i")
    assert len(read_until(source, 5)) == 5
    assert _confirmed(conn) < at_barrier["lsn"]
    source.commit(1)
    assert _confirmed(conn) == at_barrier["lsn"]
    source.close()
    again = PostgresCdcSource(dsn=url, tables=["orders"], slot="s", publication="p")
    again.seek(json.loads(json.dumps(at_barrier)))
    again.open(OperatorContext("postgres_cdc-1", extra={"checkpoint": True}))
    assert sorted(r["id"] for r in read_until(again, 5)) == [11, 12, 13, 14, 15]
    assert again.read(100) == []
    again.close()


def test_a_peek_decodes_only_the_rows_after_those_already_read(db):
    """Between two checkpoints the slot keeps what was read: a later peek must not fetch and decode
    that prefix again (it did, every peek: quadratic in the checkpoint interval)."""
    url, conn = db
    source = reading_changes(url, conn, 2000)              # read, not advanced: no checkpoint completed
    decoded = []
    decode = source._decoder.decode
    source._decoder.decode = lambda data: decoded.append(data) or decode(data)
    conn.execute("INSERT INTO orders VALUES (5000, 1, 'x')")
    assert [c["id"] for c in read_until(source, 1)] == [5000]
    assert len(decoded) <= 5, f"{len(decoded)} messages decoded for one new change"   # begin, relation?, insert, commit
    source.close()


def test_without_checkpoints_the_slot_is_advanced_as_changes_are_read(db):
    url, conn = db
    source = opened(url, checkpointed=False, snapshot=False)
    conn.execute("INSERT INTO orders SELECT i, 0, '' FROM generate_series(1, 10) i")
    changes = read_until(source, 10)
    assert _confirmed(conn) == changes[-1]["lsn"]        # the server may drop the WAL read
    source.close()


def test_a_dropped_connection_is_opened_again_and_nothing_is_lost(db):
    url, conn = db
    source = reading_changes(url, conn, 5)
    (pid,) = source._conn.execute("SELECT pg_backend_pid()").fetchone()
    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
    conn.execute("INSERT INTO orders SELECT i, 0, '' FROM generate_series(6, 9) i")
    assert sorted(r["id"] for r in read_until(source, 4)) == [6, 7, 8, 9]
    assert source._conn.execute("SELECT pg_backend_pid()").fetchone()[0] != pid
    source.close()


@pytest.mark.parametrize("level", ["replica", "minimal"])
def test_a_server_without_logical_wal_is_refused_naming_the_setting(level):
    with running(wal_level=level) as url:
        source = PostgresCdcSource(dsn=url, tables=["orders"])
        with pytest.raises(RuntimeError, match=f"wal_level={level}; change data capture needs wal_level=logical"):
            source.open(None)


def test_source_worker_killed_mid_stream_every_change_once_in_the_jsonl_sink(db, tmp_path):
    url, conn = db
    conn.execute("INSERT INTO orders SELECT i, 0, '' FROM generate_series(1, 500) i")
    out = tmp_path / "changes.jsonl"
    app = Application("cdc-kill")
    (app.source("postgres_cdc", dsn=url, tables=["orders"], slot="s", publication="p")
        .map(lambda c: {"op": c["op"], "id": c["id"], "lsn": c["lsn"]})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=2, policies=[], checkpoint=str(tmp_path / "ckpt"),
                            checkpoint_interval="0.3s") as dep:
        until(lambda: _confirmed(conn) is not None, WAIT, "the source to create its slot")
        started = _confirmed(conn)
        writes = [f"UPDATE orders SET amount = amount + 1 WHERE id = {i}" for i in range(1, 501)]
        for sql in writes[:250]:
            conn.execute(sql)
        until(lambda: len(dep.checkpoints()) >= 2 and _lines(out) > 500, WAIT, "checkpoints with changes")
        placement = dep.placement()
        os.kill(dep.worker_info[placement.pes[_source_pe(placement)].worker]["pid"], signal.SIGKILL)
        for sql in writes[250:]:
            conn.execute(sql)
        until(lambda: _lines(out) >= 1000, WAIT, "every change in the sink")
        assert dep.status()["checkpoints"]["restart"]["restarts"], "no restart was recorded"
        until(lambda: _confirmed(conn) > started, WAIT, "completed checkpoints to advance the slot")
        dep.stop()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["op"], r["id"]) for r in rows) == sorted(
        [("insert", i) for i in range(1, 501)] + [("update", i) for i in range(1, 501)])


def test_latest_keeps_the_current_row_per_key_through_a_live_copy(db, tmp_path):
    """postgres_cdc -> key_by("id").latest() -> jsonl, latest copied while it runs: folding its
    upserts and deletes gives the table as it is at the end."""
    url, conn = db
    conn.execute("INSERT INTO orders SELECT i, i, '' FROM generate_series(1, 300) i")
    out = tmp_path / "state.jsonl"
    app = Application("cdc-latest")
    (app.source("postgres_cdc", dsn=url, tables=["orders"], slot="s", publication="p")
        .key_by("id").latest(id="current")
        .map(lambda c: {"op": c["op"], "id": c["id"], "amount": str((c["row"] or {}).get("amount"))})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=2, policies=[]) as dep:
        until(lambda: _lines(out) >= 300, WAIT, "the snapshot's upserts")
        record = dep.apply(Replicate("current", 1))
        assert record.applied, record.reason
        conn.execute("UPDATE orders SET amount = amount * 2 WHERE id % 3 = 0")
        conn.execute("DELETE FROM orders WHERE id % 5 = 0")
        conn.execute("INSERT INTO orders SELECT i, 1, '' FROM generate_series(301, 320) i")
        until(lambda: _lines(out) >= 300 + 100 + 60 + 20, WAIT, "every change's effect")
        dep.stop()
    state: dict = {}
    for line in out.read_text().splitlines():
        c = json.loads(line)
        if c["op"] == "upsert":
            state[c["id"]] = c["amount"]
        else:
            del state[c["id"]]
    table = dict(conn.execute("SELECT id, amount::text FROM orders").fetchall())
    assert state == table


def _confirmed(conn) -> int | None:
    found = conn.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                         "WHERE slot_name = 's'").fetchone()
    return found and found[0]


def _lines(path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _source_pe(placement) -> str:
    return next(pe_id for pe_id, pe in placement.pes.items()
                if any(op.startswith("postgres_cdc") for op in pe.operators))


def run_docs_block(tag: str, url: str, tmp_path) -> subprocess.CompletedProcess:
    """docs/connectors.md's one ```TAG block, in a file of its own run with PG_DSN set; it must exit 0."""
    (code,) = re.findall(rf"```{tag}\n(.*?)```", DOC.read_text(), re.S)
    (tmp_path / "pasted.py").write_text(code)
    done = subprocess.run([sys.executable, "pasted.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PG_DSN": url})
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def test_the_docs_postgres_block_runs_as_pasted(db, tmp_path):
    """docs/connectors.md's ```python postgres block, in a file of its own, with PG_DSN set."""
    done = run_docs_block("python postgres", db[0], tmp_path)
    assert "100 rows in the snapshot, 20 changes after it" in done.stdout


def test_cdc_latest_aggregate_retracts_updates_and_deletes_through_a_live_copy(db, tmp_path):
    """postgres_cdc -> key_by("id").latest() -> aggregate(by="note"), the aggregate copied while it
    runs: updates that change a row's amount or move it to another group, and deletes, are taken
    back out, so the folded results equal the table's GROUP BY at the end."""
    url, conn = db
    conn.execute("INSERT INTO orders SELECT i, i * 1.5, 'g' || (i % 4) FROM generate_series(1, 400) i")
    out = tmp_path / "totals.jsonl"
    app = Application("cdc-aggregate")
    (app.source("postgres_cdc", dsn=url, tables=["orders"], slot="s", publication="p")
        .key_by("id").latest()
        .aggregate({"n": "count", "total": ("sum", "amount"), "hi": ("max", "amount")}, by="note", id="totals")
        .map(lambda r: {k: str(v) if k in ("total", "hi") else v for k, v in r.items()})
        .sink("jsonl", path=str(out)))

    def grouped() -> dict:
        return {g: {"n": n, "total": str(t), "hi": str(h)} for g, n, t, h in conn.execute(
            "SELECT note, count(*), sum(amount), max(amount) FROM orders GROUP BY note")}

    with pescheduler.deploy(app, workers=2, policies=[]) as dep:
        until(lambda: _folded(out) == grouped(), WAIT, "the snapshot's totals")
        record = dep.apply(Replicate("totals", 1))
        assert record.applied, record.reason
        conn.execute("UPDATE orders SET amount = amount * 2 WHERE id % 3 = 0")
        conn.execute("UPDATE orders SET note = 'g9' WHERE id % 7 = 0")      # moved to another group
        conn.execute("DELETE FROM orders WHERE id % 5 = 0 OR note = 'g2'")     # g2 emptied
        conn.execute("UPDATE orders SET amount = 0 WHERE id = (SELECT max(id) FROM orders WHERE note = 'g1')")
        expected = grouped()
        assert "g2" not in expected and "g9" in expected
        until(lambda: _folded(out) == expected, WAIT, f"the totals of {expected}")
        dep.stop()


def _folded(path) -> dict:
    """An aggregate's jsonl changelog folded into its current row per group."""
    state: dict = {}
    for line in (path.read_text().split("\n")[:-1] if path.exists() else []):   # whole lines only
        r = json.loads(line)
        del r["version"]
        if r.pop("op") == "delete":
            del state[r["note"]]
        else:
            state[r.pop("note")] = r
    return state


def test_the_cdc_to_iceberg_example_runs_as_its_docstring_says(db, tmp_path):
    """examples/cdc_to_iceberg.py: setup, ``python -m pescheduler deploy`` with checkpoints, the
    changes while it runs, then check: Iceberg's current totals equal PostgreSQL's GROUP BY.

    The docstring's ``wait`` waits out ``--duration 60``; here the deployment is stopped (the same
    drain as the duration's end) once the Iceberg table holds the changes (a checkpoint past them
    committed), read as ``check`` reads it; or once the duration ended it. The fixed minute was most
    of the test's time. (The wait was for the slot's confirmed LSN to reach the WAL's position
    after the changes, which it never does when the server writes WAL of its own after the last
    change, a running-transactions record or an autovacuum: the slot confirms transactions' ends;
    a loaded suite waited out its bound, session 79.)"""
    url, conn = db
    example = Path(__file__).parent.parent.parent / "examples" / "cdc_to_iceberg.py"

    here = os.getcwd()
    os.chdir(tmp_path)                           # the example's catalog: ./out, resolved at its import
    try:
        current_totals = runpy.run_path(str(example))["current_totals"]
    finally:
        os.chdir(here)
    looked = [0.0]

    def in_iceberg() -> bool:
        """Iceberg's current totals equal PostgreSQL's GROUP BY (the example's own reading), looked
        at once a second at most: a look loads the catalog and scans the table, and at the wait's
        pace it would take a core from the deployment it waits for."""
        from pyiceberg.exceptions import NoSuchTableError

        if time.monotonic() - looked[0] < 1.0:
            return False
        looked[0] = time.monotonic()
        try:
            got = current_totals()
        except NoSuchTableError:
            return False
        return got == {g: (n, total, hi) for g, n, total, hi in conn.execute(
            "SELECT region, count(*), sum(amount), max(amount) FROM shop_orders GROUP BY region")}

    env = {**os.environ, "PG_DSN": url, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}

    def step(name: str) -> str:
        done = subprocess.run([sys.executable, str(example), name], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{name}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        return done.stdout

    step("setup")
    deploying = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(example), "--checkpoint",
                                  "out/ckpt", "--duration", "60", "--json"], cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        until(lambda: deploying.poll() is not None or conn.execute(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'cdc_to_iceberg'").fetchone(),
            WAIT, "the deployment's source to create its slot")
        step("change")
        until(lambda: deploying.poll() is not None or in_iceberg(), 3 * WAIT,
              "the changes in Iceberg (a checkpoint past them), or the deployment's duration to end")
        stop = subprocess.run([sys.executable, "-m", "pescheduler", "stop", "cdc-to-iceberg"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0 or deploying.poll() is not None, stop.stdout + stop.stderr
        stdout, stderr = deploying.communicate(timeout=300)
    finally:
        if deploying.poll() is None:
            deploying.kill()
            deploying.wait(timeout=30)
    assert deploying.returncode == 0, stdout[-2000:] + stderr[-4000:]
    out = step("check")
    assert "equal to the table's GROUP BY: True" in out, out
    assert "'r9'" in out and "'r3'" not in out      # r9 made by moved rows; r3 emptied by deletes


def test_the_docs_cdc_to_iceberg_block_runs_as_pasted(db, tmp_path):
    """docs/connectors.md's ```python postgres iceberg block (CDC -> latest -> aggregate -> Iceberg)."""
    done = run_docs_block("python postgres iceberg", db[0], tmp_path)
    assert "iceberg: {'r0': (150, " in done.stdout and "'r2'" not in done.stdout, done.stdout

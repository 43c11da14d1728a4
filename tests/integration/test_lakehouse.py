"""Issue 32: files in, Delta and Iceberg tables out, exactly once through a SIGKILLed worker.

Each test streams Parquet files (written with pyarrow into a local directory) through a real
embedded cluster with checkpoints, SIGKILLs the worker that runs the table sink once a
checkpoint is complete, and reads the table back with the format's own reader (deltalake,
pyiceberg on its SQL catalog over SQLite): every row exactly once. The files source's copies
and its object-store path (``memory://`` in the deploying process) are tested without a kill.
"""

from __future__ import annotations

import json
import os
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pescheduler
from pescheduler import Application, Replicate
from waiting import manifests, until

pytestmark = pytest.mark.integration

WAIT = 120                      # a bound on every wait
FILES, ROWS = 12, 2_500         # 30,000 rows read at 3,000 rows/s: ten seconds of stream


def write_files(folder, files: range = range(FILES)) -> None:
    folder.mkdir(exist_ok=True)
    for f in files:
        n = list(range(f * ROWS, (f + 1) * ROWS))
        pq.write_table(pa.table({"n": n, "k": [f"k{i % 3}" for i in n]}), folder / f"part-{f:03d}.parquet",
                       row_group_size=1_000)


def files_app(folder, sink: str, source_options: dict | None = None, **params) -> Application:
    app = Application(f"files-to-{sink}")
    (app.source("files", path=str(folder), format="parquet", rate=3_000, ts_field=None,
                storage_options=source_options)
        .map(lambda r: {**r, "twice": 2 * r["n"]})
        .sink(sink, partition_by="k", **params))
    return app


def kill_worker_of(dep, op_id: str) -> None:
    until(lambda: dep.checkpoints(), WAIT, "a complete checkpoint")
    placement = dep.placement()
    os.kill(dep.worker_info[placement.pes[placement.pe_of(op_id)].worker]["pid"], signal.SIGKILL)


def run_killed(app, tmp_path, sink_id: str) -> None:
    with pescheduler.deploy(app, workers=3, policies=[], checkpoint=str(tmp_path / "ckpt"),
                            checkpoint_interval="0.5s") as dep:
        kill_worker_of(dep, sink_id)
        assert dep.wait(timeout=WAIT)["state"] == "finished"
        assert dep.status()["checkpoints"]["restart"]["restarts"], "no restart was recorded"


def assert_exactly_once(rows: list) -> None:
    assert sorted(r["n"] for r in rows) == list(range(FILES * ROWS))
    assert all(r["twice"] == 2 * r["n"] and r["k"] == f"k{r['n'] % 3}" for r in rows)


def test_files_to_delta_with_the_sinks_worker_killed_writes_every_row_once(tmp_path):
    from deltalake import DeltaTable

    write_files(tmp_path / "in")
    run_killed(files_app(tmp_path / "in", "delta", path=str(tmp_path / "delta")), tmp_path, "delta-3")
    table = DeltaTable(str(tmp_path / "delta"))
    assert_exactly_once(table.to_pyarrow_table().to_pylist())
    assert table.metadata().partition_columns == ["k"]


def test_files_to_iceberg_with_the_sinks_worker_killed_writes_every_row_once(tmp_path):
    from pyiceberg.catalog import load_catalog

    write_files(tmp_path / "in")
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    run_killed(files_app(tmp_path / "in", "iceberg", catalog=catalog, table="lake.numbers"), tmp_path, "iceberg-3")
    table = load_catalog("default", **catalog).load_table("lake.numbers")
    assert_exactly_once(table.scan().to_arrow().to_pylist())
    assert len(table.metadata.snapshots) >= 2          # one snapshot per checkpoint, not one in all


def test_two_copies_of_the_files_source_split_the_files_and_read_every_row_once(tmp_path):
    write_files(tmp_path / "in")
    out = tmp_path / "out.jsonl"
    app = Application("files-copies")
    app.source("files", path=str(tmp_path / "in"), rate=2_000, ts_field=None).sink("jsonl", path=str(out))
    with pescheduler.deploy(app, workers=2, policies=[]) as dep:
        until(lambda: read_by(dep, "files-1") > 0, WAIT, "the source reads")
        rec = dep.apply(Replicate("files-1", 1))
        assert rec.applied, rec.reason
        until(lambda: read_by(dep, "files-1#1") > 0, WAIT, "the copy reads files of its own")
        assert dep.wait(timeout=WAIT)["state"] == "finished"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["n"] for r in rows) == list(range(FILES * ROWS)), "a row lost or read twice"


def read_by(dep, op: str) -> int:
    m = dep.snapshot().operators.get(op)
    return m.tuples_out if m else 0


def test_files_to_parquet_with_the_sinks_worker_killed_duckdb_reads_every_row_once(tmp_path):
    import duckdb

    write_files(tmp_path / "in")
    out = tmp_path / "table"
    app = Application("files-to-parquet")
    (app.source("files", path=str(tmp_path / "in"), rate=3_000, ts_field=None)
        .map(lambda r: {**r, "twice": 2 * r["n"]})
        .sink("parquet", path=str(out), rows=4_000, partition_by="k"))
    run_killed(app, tmp_path, "parquet-3")
    rows = duckdb.sql(f"select * from read_parquet('{out}/**/*.parquet', hive_partitioning=true)").to_arrow_table()
    assert_exactly_once(rows.to_pylist())


APP = """
from pescheduler import Application

app = Application("files-to-{sink}")
(app.source("files", path={folder!r}, rate=2_000, ts_field=None, watch=True, poll="0.2s")
    .map(lambda r: {{**r, "twice": 2 * r["n"]}})
    .sink({sink!r}, partition_by="k", **{params!r}))
"""


@pytest.mark.parametrize("sink", ["delta", "iceberg"])
def test_restore_latest_after_the_deploying_process_is_killed_writes_every_row_once(tmp_path, sink):
    """The deploying process and its workers SIGKILLed mid-stream, then ``deploy --restore latest``:
    the restored sink goes on under its writer identity, so the commit it repeats is skipped.
    Mid-stream by construction: the source watches its folder, which holds half the files until
    the kill (on a loaded machine the whole input was once read before the second checkpoint
    committed); the restored run is stopped (SIGTERM: drained) once every row is in."""
    import subprocess
    import sys

    import psutil

    from waiting import gone

    write_files(tmp_path / "in", range(FILES // 2))
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    params = {"path": str(tmp_path / "delta")} if sink == "delta" else {"catalog": catalog, "table": "lake.numbers"}
    (tmp_path / "app.py").write_text(APP.format(sink=sink, folder=str(tmp_path / "in"), params=params))
    storage = tmp_path / "ckpt"
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    cmd = [sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"), "--workers", "2", "--json",
           "--policy", "none", "--checkpoint", str(storage), "--checkpoint-interval", "1s"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        # Killed once the table holds a commit and two checkpoints are complete: the restore from
        # the newest repeats the commits its snapshot holds that the table has (the path the
        # writer identity protects). Not "the newest checkpoint's commit", nor one of checkpoint 2
        # or later: a checkpoint that sealed no rows commits nothing, and once the first half was
        # read every later one is such (loaded suites, session 79: 120 s without either).
        until(lambda: committed_ids(sink, tmp_path, catalog) and newest_checkpoint(storage) >= 2,
              WAIT, "a commit in the table and two complete checkpoints")
    finally:
        tree = [first, *psutil.Process(first.pid).children(recursive=True)]
        for proc in tree:
            proc.send_signal(signal.SIGKILL)
        gone([p.pid for p in tree], WAIT, "the killed deployment's processes")
    before = len(read_table(sink, tmp_path, catalog))
    assert 0 < before <= FILES // 2 * ROWS                          # killed mid-stream, after a commit
    write_files(tmp_path / "in", range(FILES // 2, FILES))         # (no deployment reads the folder now)
    err = tmp_path / "resumed.err"
    with open(err, "w") as log:
        resumed = subprocess.Popen(cmd + ["--restore", "latest"], stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        until(lambda: len({r["n"] for r in read_table(sink, tmp_path, catalog)}) == FILES * ROWS
              or resumed.poll() is not None, WAIT, "every row in the table")
    finally:
        resumed.send_signal(signal.SIGTERM)             # the source watches: drained, flushed, ended
        resumed.wait(WAIT)
    assert resumed.returncode == 143, err.read_text()[-3000:]
    assert_exactly_once(read_table(sink, tmp_path, catalog))


def newest_checkpoint(storage) -> int:
    ids = [int("".join(c for c in m.parent.name if c.isdigit()) or 0) for m in manifests(storage)]
    return max(ids, default=0)


def committed_ids(sink: str, tmp_path, catalog: dict) -> set:
    """The checkpoint ids the table holds commits of (Delta: the log's txn actions; Iceberg: the
    snapshots' properties)."""
    if sink == "delta":
        log = tmp_path / "delta" / "_delta_log"
        actions = [json.loads(line) for f in log.glob("*.json") for line in f.read_text().splitlines()] \
            if log.is_dir() else []
        return {a["txn"]["version"] for a in actions if "txn" in a}
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        snapshots = load_table(catalog).metadata.snapshots
    except (NoSuchTableError, NoSuchNamespaceError):
        return set()
    return {int(s.summary["pescheduler.checkpoint"]) for s in snapshots if s.summary["pescheduler.checkpoint"]}


def load_table(catalog: dict):
    from pyiceberg.catalog import load_catalog

    return load_catalog("default", **catalog).load_table("lake.numbers")


def read_table(sink: str, tmp_path, catalog: dict) -> list:
    if sink == "delta":
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(str(tmp_path / "delta")).to_pyarrow_table().to_pylist()
        except TableNotFoundError:
            return []
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return load_table(catalog).scan().to_arrow().to_pylist()
    except (NoSuchTableError, NoSuchNamespaceError):
        return []

"""Lakehouse connectors benchmark: files -> window -> parquet / Delta / Iceberg, against pyarrow by hand.

    python bench/connectors.py [--events 2000000] [--files 20] [--quick]

The input is ``--events`` connected-car events (car, speed, ts) in ``--files``
Parquet files. Each table format is written twice, and both outputs are
read back and checked equal (windows, cars and averages):

  by hand: ``pyarrow.dataset`` reads the files, ``group_by`` averages the
           speed per car and minute, one write of the result (the baseline)
  pescheduler: ``source("files", columnar=True)`` -> ``key_by("car")`` ->
           1-minute window -> the sink, deployed on 2 workers with a
           checkpoint every second (exactly-once: one table commit per checkpoint)

Figures: the deployment's wall time includes starting the cluster, so the
start-up of the same app over one tiny file (the better of two), measured in
the same run, is subtracted ("net"); the ratio is hand time / net time (goal >= 0.5). The
per-checkpoint commit overhead is measured on the sink alone: 20 commits of
1/20 of the windows against one commit of all, per extra commit.
Loaded-machine figures (L): compare the ratios, not the times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

import pescheduler
from pescheduler import Application
from pescheduler.operator import Emitter, OperatorContext
from pescheduler.operators.delta import DeltaSink
from pescheduler.operators.iceberg import IcebergSink
from pescheduler.operators.sinks import ParquetSink

MINUTE = 60_000


def make_files(folder: Path, events: int, files: int) -> None:
    """``events`` events, 7 cars, one every 10 ms, in ``files`` Parquet files in time order."""
    folder.mkdir(parents=True)
    per = -(-events // files)
    for f in range(files):
        i = pa.array(range(f * per, min(events, (f + 1) * per)), pa.int64())
        pq.write_table(pa.table({"car": pc.cast(pc.binary_join_element_wise("car-", pc.cast(pc.remainder(i, 7), pa.string()), ""), pa.string()),
                                 "speed": pc.cast(pc.remainder(pc.multiply(i, 13), 130), pa.float64()),
                                 "ts": pc.multiply(i, 10)}), folder / f"part-{f:04d}.parquet")


def by_hand(folder: Path) -> pa.Table:
    """The baseline's windows: every file read by pyarrow.dataset, averaged per car and minute."""
    table = ds.dataset(folder, format="parquet").to_table()
    start = pc.subtract(table["ts"], pc.remainder(table["ts"], MINUTE))
    table = table.append_column("window_start", start)
    out = table.group_by(["car", "window_start"]).aggregate([("speed", "mean")])
    return out.select(["car", "window_start", "speed_mean"]).rename_columns(["car", "window_start", "avg_speed"])


# -- the formats: write by hand, sink parameters, read back --------------------------------------
class Parquet:
    name, cls = "parquet", ParquetSink

    def __init__(self, root: Path):
        self.root = root

    def hand(self, table: pa.Table, where: str) -> None:
        ds.write_dataset(table, self.root / where, format="parquet")

    def sink(self, where: str) -> dict:
        return {"path": str(self.root / where), "rows": 1_000_000}

    def read(self, where: str) -> pa.Table:
        return ds.dataset(self.root / where, format="parquet").to_table()


class Delta(Parquet):
    name, cls = "delta", DeltaSink

    def hand(self, table, where):
        from deltalake import write_deltalake

        write_deltalake(str(self.root / where), table, mode="append")

    def sink(self, where):
        return {"path": str(self.root / where)}

    def read(self, where):
        from deltalake import DeltaTable

        return DeltaTable(str(self.root / where)).to_pyarrow_table()


class Iceberg(Parquet):
    name, cls = "iceberg", IcebergSink

    def catalog(self) -> dict:
        return {"type": "sql", "uri": f"sqlite:///{self.root}/catalog.db", "warehouse": f"file://{self.root}/wh"}

    def hand(self, table, where):
        from pyiceberg.catalog import load_catalog

        catalog = load_catalog("default", **self.catalog())
        catalog.create_namespace_if_not_exists("bench")
        catalog.create_table(f"bench.{where}", schema=table.schema).append(table)

    def sink(self, where):
        return {"catalog": self.catalog(), "table": f"bench.{where}"}

    def read(self, where):
        from pyiceberg.catalog import load_catalog

        return load_catalog("default", **self.catalog()).load_table(f"bench.{where}").scan().to_arrow()


def deployed(fmt, folder: Path, where: str, checkpoints: Path) -> float:
    """Wall time of the deployment files -> window -> ``fmt``'s sink (cluster start included)."""
    app = Application(f"files-{fmt.name}-{where}")
    (app.source("files", path=str(folder), columnar=True)
        .key_by("car")
        .window(size="60s", aggregates={"avg_speed": ("avg", "speed")})
        .sink(fmt.name, **fmt.sink(where)))
    t0 = time.perf_counter()
    with pescheduler.deploy(app, workers=2, policies=[], checkpoint=str(checkpoints / where),
                            checkpoint_interval="1s") as dep:
        state = dep.wait(timeout=1800)["state"]
    assert state == "finished", state
    return time.perf_counter() - t0


def windows(table: pa.Table) -> list:
    rows = table.select(["car", "window_start", "avg_speed"]).to_pylist()
    return sorted((r["car"], r["window_start"], round(r["avg_speed"], 9)) for r in rows)


def commit_overhead(fmt, windows_table: pa.Table, root: Path, commits: int = 20) -> float:
    """Seconds per extra commit: ``commits`` checkpoints of 1/commits of the rows vs one of all."""
    def run(where: str, parts: int) -> float:
        sink = fmt.cls(**fmt.sink(where))
        sink.open(OperatorContext(f"{fmt.name}-1", extra={"checkpoint": True}))
        step = -(-len(windows_table) // parts)
        t0 = time.perf_counter()
        for c in range(parts):
            part = windows_table.slice(c * step, step)
            sink.process(part.combine_chunks().to_batches()[0] if sink.columnar else part.to_pylist(), Emitter())
            sink.pre_commit(c + 1)
            sink.commit(c + 1)
        return time.perf_counter() - t0
    one, many = run("overhead_one", 1), run("overhead_many", commits)
    return (many - one) / (commits - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.events, args.files = 200_000, 4
    root = Path(tempfile.mkdtemp(prefix="bench-connectors-"))
    try:
        run(root, args.events, args.files)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, events: int, files: int) -> None:
    make_files(root / "in", events, files)
    make_files(root / "tiny", 1_000, 1)
    print(f"files -> 1-minute window -> table: {events:,} events in {files} Parquet files, 2 workers, "
          f"checkpoint every 1 s; load: {os.getloadavg()[0]:.1f} (1-min, 2 cores shared) (L)")
    print(f"  {'format':<8s} {'by hand s':>9s} {'deploy s':>9s} {'start-up s':>10s} {'net s':>7s} "
          f"{'x hand':>7s} {'commits':>8s} {'ms/commit':>10s}")
    for fmt in (Parquet(root), Delta(root), Iceberg(root)):
        t0 = time.perf_counter()
        expected = by_hand(root / "in")
        fmt.hand(expected, "hand")
        hand = time.perf_counter() - t0
        startup = min(deployed(fmt, root / "tiny", f"startup{i}", root / "ckpt") for i in range(2))
        total = deployed(fmt, root / "in", "stream", root / "ckpt")
        assert windows(fmt.read("stream")) == windows(fmt.read("hand")), f"{fmt.name}: windows differ"
        net = total - startup
        overhead = commit_overhead(fmt, expected, root)
        ratio = f"{hand / net:7.2f}" if net > 0.1 * total else "  noise"    # within start-up's spread
        print(f"  {fmt.name:<8s} {hand:9.2f} {total:9.2f} {startup:10.2f} {net:7.2f} {ratio} "
              f"{commits_of(fmt):>8} {overhead * 1000:10.1f}")
    print("  output checked: the stream's windows equal the hand-written ones for every format")


def commits_of(fmt) -> str:
    if fmt.name == "delta":
        from deltalake import DeltaTable

        return str(len(DeltaTable(str(fmt.root / "stream")).history()))
    if fmt.name == "iceberg":
        from pyiceberg.catalog import load_catalog

        return str(len(load_catalog("default", **fmt.catalog()).load_table("bench.stream").metadata.snapshots))
    return "-"


if __name__ == "__main__":
    main()

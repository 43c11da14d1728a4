"""The night batch: a stream on hosts borrowed from Spark gives one back to a batch job, then takes it again.

    pip install -e ".[spark]"        # and Java 17
    python examples/night_batch.py

1. A Spark standalone cluster with two single-core workers starts here, and a
   PySpark application with dynamic allocation owns it (``--rm spark``).
2. A connected-cars stream (average speed per car and minute) borrows both
   hosts and spreads over them; it writes its windows as Parquet files.
3. A Spark batch job of the same application aggregates that Parquet. It
   finds no free slot, so Spark asks for a host back; pescheduler moves the
   PEs off it and returns it; the batch job runs there.
4. The job ends; pescheduler borrows a host again and spreads out.

It prints a timeline of events and placements, checks the batch job's result
against the files it read, and the stream's whole output against a plain
Python reference.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

import dask.config

import pescheduler
from pescheduler import Application, BorrowHosts, Move, Split

GENERATOR = dict(events=None, keys=1_000, seed=11, rate=20_000)   # a 60 s window every 3 s, until stopped
SPARK = {"workers": 2, "max-executors": 2, "executor-idle-timeout": "20s", "return-within": "10s"}
T0 = time.monotonic()


def to_metres_per_second(event):
    return {**event, "speed": event["speed"] / 3.6}


def moving(event):
    return event["speed"] > 5


def build(path: str) -> Application:
    app = Application("night-stream")
    (app.source("generator", **GENERATOR)
        .map(to_metres_per_second)
        .filter(moving)
        .key_by("car")
        .window(size="60s", aggregates={"avg_speed": ("avg", "speed")}, id="avg")
        .sink("parquet", path=path, roll="60s", ts_field="window_start", id="parquet"))
    return app


def reference(events: int) -> list[dict]:
    """The stream's output computed as a plain Python loop over the same first ``events`` events."""
    from pescheduler.operators.sources import GeneratorSource

    source = GeneratorSource(**{**GENERATOR, "rate": None, "events": events})
    sums: dict = {}
    while (batch := source.read(10_000)) is not None:
        for e in batch:
            speed = e["speed"] / 3.6
            if speed > 5:
                acc = sums.setdefault((e["ts"] - e["ts"] % 60_000, e["car"]), [0.0, 0])
                acc[0] += speed
                acc[1] += 1
    return [{"car": car, "window_start": start, "window_end": start + 60_000, "avg_speed": s / n}
            for (start, car), (s, n) in sums.items()]


def say(text: str) -> None:
    print(f"{time.monotonic() - T0:6.1f} s  {text}", flush=True)


def placement(dep) -> str:
    return " | ".join(f"{pe} @ {p.host}" for pe, p in dep.placement().pes.items())


def until(predicate, what: str, timeout: float = 120) -> None:
    """Poll (Spark and Dask offer no event for these) until true, or stop saying what did not happen."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def batch_job(sc, path: str, out: dict) -> None:
    """Average speed per window over every complete window the stream has written so far."""
    from pyspark.sql import SparkSession, functions as F

    sc.setJobGroup("night-batch", "aggregate the stream's Parquet", interruptOnCancel=True)
    table = SparkSession(sc).read.parquet(path)
    out["files"] = table.inputFiles()
    rows = table.groupBy("window_start").agg(F.count("*").alias("cars"), F.sum("avg_speed").alias("total"))
    out["result"] = {r["window_start"]: (r["cars"], r["total"]) for r in rows.collect()}


def check_batch(out: dict) -> bool:
    """The batch job's figures equal the same aggregation of the files it read, done here with pyarrow."""
    import pyarrow.parquet as pq

    mine: dict = {}
    for f in out["files"]:
        for r in pq.read_table(f.removeprefix("file://")).to_pylist():
            cars, total = mine.get(r["window_start"], (0, 0.0))
            mine[r["window_start"]] = (cars + 1, total + r["avg_speed"])
    return mine.keys() == out["result"].keys() and all(
        mine[k][0] == out["result"][k][0] and abs(mine[k][1] - out["result"][k][1]) < 1e-6 for k in mine)


def run(path: str) -> int:
    # Steps are applied by hand here, as a policy would: no policy runs beside them.
    with dask.config.set({"pescheduler.rm.spark": SPARK, "pescheduler.policies.default": []}):
        with pescheduler.deploy(build(path), workers=1, rm="spark") as dep:
            say(f"deployed on the home worker: {placement(dep)}")
            until(lambda: dep.resources().lendable == 2, "the Spark application to start", 180)
            say("Spark application up with dynamic allocation; borrowing 2 hosts")
            dep.apply(BorrowHosts(2, reason="spread the stream"), timeout=120)
            a, b = (dep.hosts.borrowed[h].workers[0] for h in sorted(dep.hosts.borrowed))
            (pe,) = dep.placement().pes
            dep.apply(Split(pe, ["avg", "parquet"], worker=b))
            dep.apply(Move(next(iter(dep.placement().pes)), a))
            say(f"spread over Spark executors: {placement(dep)}")
            until(lambda: os.path.isdir(path) and any(f.endswith(".parquet") for f in os.listdir(path)),
                  "the first Parquet files")
            out: dict = {}
            job = threading.Thread(target=batch_job, args=(dep.hosts.rm.sc, path, out))
            say("batch job submitted (same Spark application)")
            job.start()
            job.join(180)
            say(f"batch job done: {len(out['result'])} windows from {len(out['files'])} files; "
                f"equal to the same aggregation of those files: {check_batch(out)}")
            say(f"placement while it ran: {placement(dep)}")
            until(lambda: dep.resources().lendable >= 1, "Spark to free a slot")
            dep.apply(BorrowHosts(1, reason="the batch job is done"), timeout=120)
            new = [h for h in dep.hosts.borrowed if h not in {p.host for p in dep.placement().pes.values()}]
            movable = [p for p, x in dep.placement().pes.items() if x.host not in dep.hosts.borrowed]
            if new and movable:
                dep.apply(Move(movable[0], dep.hosts.borrowed[new[0]].workers[0]))
            say(f"spread out again: {placement(dep)}")
            time.sleep(3)                          # the stream runs on the new host for a while
            status = dep.stop()                    # drain: every window fires, every file is written
            emitted = next(o["tuples_out"] for o in status["operators"] if o["op"] == "generator-1")
            say(f"stream stopped after {emitted:,} events")
        print("\ntimeline (pescheduler status events):")
        for e in status["events"]:
            print(f"  {e['t']:6.1f} s  {e['kind']:<12} {e['text']}")
    import pyarrow.dataset as ds

    key = lambda r: (r["window_start"], r["car"])        # noqa: E731
    rows = sorted(ds.dataset(path, format="parquet").to_table().to_pylist(), key=key)
    same = rows == sorted(reference(emitted), key=key)
    print(f"\nstream output ({len(rows)} rows) equal to the plain-Python reference: {same}")
    return 0 if same and check_batch(out) else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        raise SystemExit(run(os.path.join(tmp, "avg_speed")))

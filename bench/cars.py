"""The connected-car pipeline every way we run it, over the same pre-made events (shared by
fusion.py and columnar.py).

Work: speed km/h -> m/s, keep speed > 5, 60 s tumbling event-time window
average per car. Every variant reads events made before its clock starts
(the generator's, seed 7, 10,000 cars) and returns ``(seconds, rows)``; rows
are checked against the hand loop's after the clock stops:
exactly for every pescheduler variant, to 1e-12 for numpy (``bincount`` adds
per-batch partial sums, a different float order).

Baselines (honest: the same work, no more): a hand-written loop over the
dicts, the same loop over tuples, and numpy over the same columns.

``--cpu`` (:func:`use_cpu`): every figure is CPU time instead of the time passed: the
process's for what runs here (the baselines, in-process), the worker process's from the
source's first read to the sink's end for a deployment (its event loop's other work
included). On a shared machine the time passed swings with the load (2-4x between rounds
at load 5-8); CPU time does not, though caches shared with other processes still slow it.
"""

from __future__ import annotations

import math
import os
import pickle
import tempfile
import time
from typing import Callable

import numpy as np
import pyarrow.compute  # noqa: F401  (imported before any clock starts)

import pescheduler
from pescheduler import Application, col

import benchops
import pescheduler.operators.columnar_window  # noqa: F401

SIZE = 60_000
_clock = time.perf_counter          # what every variant times with: perf_counter, or process_time (--cpu)


def use_cpu(on: bool = True) -> None:
    """Time every variant by CPU time (``time.process_time``), not by the time passed."""
    global _clock
    _clock = time.process_time if on else time.perf_counter


def cpu() -> bool:
    """Are the variants timed by CPU time (:func:`use_cpu`)?"""
    return _clock is time.process_time


def _rows(panes: dict) -> list:
    return [{"car": k, "window_start": p, "window_end": p + SIZE, "avg_speed": s / n}
            for p, d in panes.items() for k, (s, n) in d.items()]


def hand_dicts(events: int) -> tuple[float, list]:
    """The loop a user would write over the event dicts (the same dict work as the lambda app)."""
    batches = benchops.premade_events(events, False)
    t0 = _clock()
    panes: dict = {}
    for batch in batches:
        for e in batch:
            e = {**e, "speed": e["speed"] / 3.6}
            if e["speed"] > 5:
                ts = e["ts"]
                p = ts - ts % SIZE
                d = panes.get(p)
                if d is None:
                    d = panes[p] = {}
                s = d.get(e["car"])
                if s is None:
                    d[e["car"]] = [e["speed"], 1]
                else:
                    s[0] += e["speed"]
                    s[1] += 1
    rows = _rows(panes)
    return _clock() - t0, rows


def hand_tuples(events: int) -> tuple[float, list]:
    """The same loop over ``(car, speed, lat, lon, ts)`` tuples (made before the clock starts)."""
    batches = [[(e["car"], e["speed"], e["lat"], e["lon"], e["ts"]) for e in b]
               for b in benchops.premade_events(events, False)]
    t0 = _clock()
    panes: dict = {}
    for batch in batches:
        for car, speed, _lat, _lon, ts in batch:
            speed = speed / 3.6
            if speed > 5:
                p = ts - ts % SIZE
                d = panes.get(p)
                if d is None:
                    d = panes[p] = {}
                s = d.get(car)
                if s is None:
                    d[car] = [speed, 1]
                else:
                    s[0] += speed
                    s[1] += 1
    rows = _rows(panes)
    return _clock() - t0, rows


def numpy_columns(events: int) -> tuple[float, list]:
    """numpy over the same columns (Arrow batches as numpy arrays): per-pane bincount sums."""
    batches = benchops.premade_events(events, True)
    cols = [(b.column(0).indices.to_numpy(), b.column(1).to_numpy(), b.column(4).to_numpy()) for b in batches]
    cars = batches[0].column(0).dictionary.to_pylist()
    k = len(cars)
    t0 = _clock()
    panes: dict = {}
    for car, speed, ts in cols:
        speed = speed / 3.6
        keep = speed > 5
        car, speed, ts = car[keep], speed[keep], ts[keep]
        pane = ts - ts % SIZE
        for p in range(int(pane.min()), int(pane.max()) + 1, SIZE):
            sel = pane == p
            acc = panes.get(p)
            if acc is None:
                acc = panes[p] = [np.zeros(k), np.zeros(k, dtype=np.int64)]
            acc[0] += np.bincount(car[sel], weights=speed[sel], minlength=k)
            acc[1] += np.bincount(car[sel], minlength=k)
    out = {p: (s / np.maximum(n, 1), n > 0) for p, (s, n) in panes.items()}
    elapsed = _clock() - t0
    rows = [{"car": cars[i], "window_start": p, "window_end": p + SIZE, "avg_speed": avg[i]}
            for p, (avg, present) in out.items() for i in np.flatnonzero(present).tolist()]
    return elapsed, rows


# The pipeline in DuckDB's SQL: bench/sql.py's QUERY with its TUMBLE written out (DuckDB has none).
DUCKDB_QUERY = f"""SELECT car, AVG(speed / 3.6) AS avg_speed,
       ts - ts % {SIZE} AS window_start, ts - ts % {SIZE} + {SIZE} AS window_end
FROM cars WHERE speed / 3.6 > 5
GROUP BY car, window_start, window_end"""


def _columns_table(events: int, rows: int = 65_536) -> "pyarrow.Table":
    """The pre-made Arrow batches as one table (no copy: the table holds the very batches)."""
    import pyarrow as pa

    return pa.Table.from_batches(benchops.premade_events(events, True, rows=rows))


def duckdb_columns(events: int) -> tuple[float, list]:
    """DuckDB on one thread (``SET threads=1``) over the same columns (an Arrow table it scans in
    place). Timed: the query and its result as an Arrow table, as the sink keeps Arrow batches;
    not timed: connecting, and the rows made from that table for the check."""
    import duckdb

    cars = _columns_table(events)
    con = duckdb.connect()
    con.execute("SET threads=1")
    con.register("cars", cars)
    t0 = _clock()
    out = con.sql(DUCKDB_QUERY).to_arrow_table()
    elapsed = _clock() - t0
    con.close()
    return elapsed, out.to_pylist()


def polars_columns(events: int) -> tuple[float, list]:
    """Polars on one thread (``POLARS_MAX_THREADS=1``, which must be set before polars is first
    imported: bench/columnar.py sets it at its start) over the same columns, a lazy query. Timed:
    the lazy query's collect (its result a DataFrame, Arrow memory); not timed: the table made a
    DataFrame (the dictionary column becomes a Categorical) and the rows for the check."""
    import polars as pl

    if pl.thread_pool_size() != 1:
        raise RuntimeError(f"polars runs {pl.thread_pool_size()} threads: set POLARS_MAX_THREADS=1 before "
                           "polars is imported (bench/columnar.py does at its start)")
    frame = pl.from_arrow(_columns_table(events))
    speed = pl.col("speed") / 3.6
    query = (frame.lazy().filter(speed > 5)
             .group_by(pl.col("car"), window_start=pl.col("ts") - pl.col("ts") % SIZE)
             .agg(avg_speed=speed.mean()))
    t0 = _clock()
    out = query.collect()
    elapsed = _clock() - t0
    rows = out.with_columns(pl.col("car").cast(pl.String), window_end=pl.col("window_start") + SIZE).to_dicts()
    return elapsed, rows


def baselines(events: int) -> dict:
    """The three baselines every speed benchmark prints first."""
    return {"hand loop, dicts": lambda: hand_dicts(events),
            "hand loop, tuples": lambda: hand_tuples(events),
            "numpy over columns": lambda: numpy_columns(events)}


def _ops(lambdas: bool) -> list:
    from pescheduler.operators.basic import Filter, KeyBy, Map
    from pescheduler.operators.window import Window

    first = ([Map(lambda e: {**e, "speed": e["speed"] / 3.6}), Filter(lambda e: e["speed"] > 5)] if lambdas
             else [Map(speed=col("speed") / 3.6), Filter(col("speed") > 5)])
    return first + [KeyBy("car"), Window(size="60s", aggregates={"avg_speed": ("avg", "speed")})]


def in_process(events: int, columnar: bool = False, lambdas: bool = False, query: str | None = None,
               plain_keys: bool = False, batch_rows: int = 65_536) -> tuple[float, list]:
    """The runtime's fused chain in this process (pescheduler.testing), no cluster; ``query``: the
    pipeline written in SQL (bench/sql.py), its operators made as a deployment makes them;
    ``plain_keys``: a plain key column, no shared dictionary (bench/columnar.py); ``batch_rows``:
    the rows of each Arrow batch the source hands over."""
    from pescheduler.testing import run_operators

    with tempfile.TemporaryDirectory() as tmp:
        source = benchops.Premade(events=events, start_path=os.path.join(tmp, "start"), columnar=columnar,
                                  plain_keys=plain_keys, batch_rows=batch_rows)
        benchops.premade_events(events, columnar, plain_keys=plain_keys, rows=batch_rows)
        sink = benchops.Collect(path=os.path.join(tmp, "out"))
        ops = _ops(lambdas) if query is None else _sql_ops(query)
        t0 = time.process_time() if cpu() else time.time()
        run_operators(source, *ops, sink, key_field="car")
        with open(os.path.join(tmp, "out"), "rb") as f:
            result = pickle.load(f)
    return result["end_cpu" if cpu() else "end"] - t0, result["rows"]   # the sink's end: its pickling is not timed


def _sql_ops(query: str) -> list:
    """The operators ``query`` compiles to over a stream ``cars``, made from the app's nodes."""
    from pescheduler.testing import chain_operators

    app = Application("cars-sql")
    return chain_operators(pescheduler.sql(query, sources={"cars": app.source("iterable", items=[])}))[1]


def deployed(events: int, workers: int = 1, columnar: bool = False, lambdas: bool = False,
             query: str | None = None, batch_rows: int = 65_536) -> tuple[float, list]:
    """A real deployment on the embedded cluster: source start -> sink end (wall clock); ``query``:
    the pipeline written in SQL over the stream ``cars``; ``batch_rows``: the rows of each Arrow
    batch the source hands over (the framework sizes what its operators see)."""
    with tempfile.TemporaryDirectory() as tmp:
        start, out = os.path.join(tmp, "start"), os.path.join(tmp, "out")
        app = Application(f"cars-{workers}-{'columnar' if columnar else 'rows'}")
        s = app.source("premade", events=events, start_path=start, columnar=columnar, batch_rows=batch_rows)
        if query is not None:
            pescheduler.sql(query, sources={"cars": s}).sink("collect_batches", path=out)
        else:
            s = (s.map(lambda e: {**e, "speed": e["speed"] / 3.6}).filter(lambda e: e["speed"] > 5) if lambdas
                 else s.map(speed=col("speed") / 3.6).filter(col("speed") > 5))
            (s.key_by("car").window(size="60s", aggregates={"avg_speed": ("avg", "speed")})
                .sink("collect_batches", path=out))
        with pescheduler.deploy(app, workers=workers, policies=[], plugins=["benchops"]) as dep:
            dep.wait(timeout=900)
            pes = len(dep.placement().pes)
        with open(out, "rb") as f:
            result = pickle.load(f)
        with open(start) as f:
            wall, cpu_s = map(float, f.read().split())
    deployed.pes = pes
    if cpu():           # the worker process's CPU time (the source and sink are in one PE: workers=1)
        if workers != 1:
            raise ValueError("--cpu times a deployment on one worker only (its process's CPU time)")
        return result["end_cpu"] - cpu_s, result["rows"]
    return result["end"] - wall, result["rows"]


def same(rows: list, reference: list, tolerance: float = 0.0) -> bool:
    """Equal result sets (order aside); ``tolerance`` relative on the averages."""
    if len(rows) != len(reference):
        return False
    key = lambda r: (r["window_start"], r["car"])  # noqa: E731
    for a, b in zip(sorted(rows, key=key), sorted(reference, key=key)):
        if key(a) != key(b) or a["window_end"] != b["window_end"]:
            return False
        if a["avg_speed"] != b["avg_speed"] and not (
                tolerance and math.isclose(a["avg_speed"], b["avg_speed"], rel_tol=tolerance)):
            return False
    return True


INEXACT = ("numpy", "DuckDB", "Polars")     # baselines that add in another order: averages to 1e-12


def measure(variants: dict[str, Callable[[], tuple[float, list]]], repeat: int,
            reference: list | None = None) -> dict[str, float]:
    """Best time of each variant over ``repeat`` interleaved rounds; every output checked (against
    ``reference``, the hand loop's rows, when given; else against the first variant's, a hand loop)."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        for label, run in variants.items():
            t, rows = run()
            reference = reference if reference is not None else rows
            ok = same(rows, reference, 1e-12 if any(w in label for w in INEXACT) else 0.0)
            assert ok, f"{label}: output differs from the hand loop's"
            best[label] = min(best.get(label, t), t)
    measure.rows = len(reference)
    return best


def report(best: dict[str, float], events: int, hand: str, numpy_label: str) -> None:
    print(f"connected-car pipeline, {events:,} pre-made events, {measure.rows:,} window results, "
          f"output checked for every variant; load: {os.getloadavg()[0]:.1f} (1-min, 2 cores shared); "
          f"{'CPU time' if cpu() else 'time passed'}")
    print(f"  {'variant':<58s} {'M ev/s':>7s} {'x hand loop':>11s} {'x numpy':>8s}")
    for label, t in best.items():
        print(f"  {label:<58s} {events / t / 1e6:7.2f} {best[hand] / t:11.2f} {best[numpy_label] / t:8.2f}")


def arguments(doc: str) -> "argparse.Namespace":
    """The command line both speed benchmarks take (``--quick``: a small smoke run)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; the best of each counts")
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    parser.add_argument("--cpu", action="store_true", help="time by CPU time, not the time passed (use_cpu)")
    args = parser.parse_args()
    use_cpu(args.cpu)
    if args.quick:
        args.events, args.repeat = 200_000, 1
    return args

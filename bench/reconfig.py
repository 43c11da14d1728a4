"""Reconfiguration benchmark: pause, throughput dip and exactly-once under steady load; monitor overhead.

    python bench/reconfig.py [--quick] [--repeat N] [--rate TUPLES_PER_S]

Pipeline (bench/benchops.py operators): counter (numbers every tuple, paced to
``--rate``) -> map -> key_by -> keyed_sum (keyed running sum: state that moves)
-> arrivals (records each batch's arrival time and every number seen), on a
3-worker embedded cluster. The compiler places it as three PEs:
``src`` | ``map`` | ``key->sum->sink``. All figures come from this run:

  1. Under steady load, each operation repeated N times (default 30, --quick 5):
       move        Move of the middle PE (map) between two workers
       fuse        Fuse of two adjacent PEs (src + map)
       split       Split of that fused PE back into src | map
       split+fuse  key_by split out of the hot PE and fused with the cold one
                   (map->key), then back (key->sum->sink): two applies each
     printed: the affected path's pause (``ApplyRecord.pause_ms``) and the wall
     time of ``dep.apply()``, p50/p99 (nearest rank: p99 of 30 is the max).
  2. Throughput dip: tuples/s at the sink in 100 ms buckets; for each apply the
     lowest bucket from its start to DIP_AFTER_S after it returned, as a share
     of the steady rate (median of the buckets near no apply).
  3. Exactly once: after ``dep.stop()`` (drains), every number the source
     emitted reached the sink exactly once, in order per key, and the keyed sums that
     moved with their PEs are exact.
  4. Monitor overhead: the same pipeline unthrottled (finite, 3 runs each,
     interleaved, best of 3) with ``pescheduler.monitor.interval`` at its
     default vs 3600 s (effectively off).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dask.config  # noqa: E402

import pescheduler  # noqa: E402
from pescheduler import Application, Fuse, Move, Split  # noqa: E402

KEYS = 100
BUCKET_S = 0.1
GAP_S = 0.6                 # steady load between two applies
DIP_AFTER_S = 0.5           # a dip is looked for from an apply's start until this long after it returned
                            # (and never into the next apply)
PAUSE_GOAL_MS = 100.0


def build(name: str, path: str, rate: float | None = None, count: int | None = None) -> Application:
    app = Application(name)
    (app.source("counter", id="src", count=count, keys=KEYS, rate=rate)
        .map(lambda t: {**t, "v": t["n"] % 7}, id="map")
        .key_by("key", id="key")
        .apply("keyed_sum", id="sum")
        .sink("arrivals", id="sink", path=path, keys=KEYS))
    return app


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def check_exactly_once(result: dict, emitted: int) -> dict:
    """Compare what the sink saw with what the source emitted (numbers 0 .. emitted-1)."""
    distinct = sum(e - s for s, e in result["runs"])
    in_range = sum(max(0, min(e, emitted) - s) for s, e in result["runs"] if s < emitted)
    return {"emitted": emitted, "received": result["count"], "lost": emitted - in_range,
            "duplicated": result["duplicates"], "unknown": distinct - in_range,
            "out_of_order": result["out_of_order"], "reordered": result.get("reordered", 0),
            "bad_sums": result["bad_sums"]}


def emitted_by_source(status: dict) -> int:
    return next(o["tuples_out"] for o in status["operators"] if o["op"] == "src")


# -- 1-3: reconfigurations under steady load ----------------------------------------------------
def reconfigurations(rate: float, repeat: int, gap: float, warmup: float) -> dict:
    applies: list[dict] = []

    def apply(dep, kind: str, action) -> dict:
        t0, c0 = time.time(), time.perf_counter()
        rec = dep.apply(action)
        wall = (time.perf_counter() - c0) * 1000
        if not rec.applied:
            raise SystemExit(f"{action!r} was not applied: {rec.reason}")
        entry = {"kind": kind, "t0": t0, "t1": time.time(), "pause_ms": rec.pause_ms, "wall_ms": wall}
        applies.append(entry)
        return entry

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "arrivals.json")
        with pescheduler.deploy(build("reconfig-bench", path, rate=rate), workers=3, plugins=["benchops"], policies=[]) as dep:
            pl = dep.placement()
            assert list(pl.pes) == ["src", "map", "key->sum->sink"], list(pl.pes)
            w_map, w_sink = pl.pes["map"].worker, pl.pes["key->sum->sink"].worker
            assert len({pe.worker for pe in pl.pes.values()}) == 3
            time.sleep(warmup)
            busy = {pe: m.busy for pe, m in dep.snapshot().pes.items()}  # which PE is hot, which cold
            for i in range(repeat):                                     # move the middle PE back and forth
                apply(dep, "move", Move("map", w_sink if i % 2 == 0 else w_map))
                time.sleep(gap)
            if repeat % 2:
                apply(dep, "move back", Move("map", w_map))             # back where it started (not in the table)
                time.sleep(gap)
            for i in range(repeat):                                     # fuse two adjacent PEs, split them again
                apply(dep, "fuse", Fuse("src", "map"))
                time.sleep(gap)
                apply(dep, "split", Split("src->map", ("map",), worker=w_map))
                time.sleep(gap)
            for i in range(repeat):                                     # key_by: hot PE -> cold PE, and back
                if i % 2 == 0:
                    a = apply(dep, "split+fuse:split", Split("key->sum->sink", ("key",), worker=w_map))
                    b = apply(dep, "split+fuse:fuse", Fuse("map", "key"))
                else:
                    a = apply(dep, "split+fuse:split", Split("map->key", ("key",), worker=w_sink))
                    b = apply(dep, "split+fuse:fuse", Fuse("sum->sink", "key"))
                applies.append({"kind": "split+fuse", "t0": a["t0"], "t1": b["t1"],
                                "pause_ms": a["pause_ms"] + b["pause_ms"], "wall_ms": a["wall_ms"] + b["wall_ms"],
                                "parts": (a["pause_ms"], b["pause_ms"])})
                time.sleep(gap)
            t_stop = time.time()
            status = dep.stop()
        problems = [e["text"] for e in status["events"] if "did not finish" in e["text"]]
        assert status["state"] == "stopped" and not problems, (status["state"], status["error"], problems)
        with open(path) as f:
            result = json.load(f)
    return {"applies": applies, "result": result, "t_stop": t_stop, "busy": busy,
            "check": check_exactly_once(result, emitted_by_source(status)),
            "dead_letters": status["dead_letters"]}


def buckets(result: dict) -> tuple[float, list[int]]:
    """(start time, tuples per BUCKET_S bucket) from the sink's per-batch arrival times."""
    times, sizes = result["times"], result["sizes"]
    t_first = times[0]
    counts = [0] * (int((times[-1] - t_first) / BUCKET_S) + 1)
    for t, n in zip(times, sizes):
        counts[int((t - t_first) / BUCKET_S)] += n
    return t_first, counts


def dips(run: dict, warmup_s: float = 1.0) -> tuple[float, str, dict[int, float]]:
    """Steady tuples/s (and how it was taken) and, per apply (index), its lowest bucket as a share
    of it. The steady rate is the median bucket away from the applies; on a machine so loaded that
    more than half of those buckets are empty (the stream arrives in bursts) the median is 0, and
    their mean is the rate instead (the loaded suite's run divided by it)."""
    t_first, counts = buckets(run["result"])
    index = lambda t: int((t - t_first) / BUCKET_S)                 # noqa: E731
    end = index(run["t_stop"])                                         # drain after this: not steady
    starts = sorted(a["t0"] for a in run["applies"])
    near = set()
    windows = {}
    for i, a in enumerate(run["applies"]):
        # until DIP_AFTER_S after it returned, but not into the next apply or the drain
        until = min([a["t1"] + DIP_AFTER_S, run["t_stop"]] + [t for t in starts if t > a["t1"]])
        lo = index(a["t0"])
        hi = max(lo, min(index(until) - 1, len(counts) - 1))
        windows[i] = (lo, hi)
        near.update(range(lo - 1, index(a["t1"] + DIP_AFTER_S) + 1))
    quiet = [counts[b] for b in range(int(warmup_s / BUCKET_S), end) if b not in near] or counts
    steady, how = statistics.median(quiet) / BUCKET_S, f"median {BUCKET_S * 1000:.0f} ms bucket away from applies"
    if not steady:
        steady, how = statistics.fmean(quiet) / BUCKET_S, (f"mean {BUCKET_S * 1000:.0f} ms bucket away from applies: "
                                                           f"over half of them empty, a loaded machine")
    return steady, how, {i: min(counts[lo:hi + 1]) / BUCKET_S / steady if steady else float("nan")
                         for i, (lo, hi) in windows.items()}


# -- 4: monitor overhead ---------------------------------------------------------------------
def unthrottled(count: int, interval: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "arrivals.json")
        with dask.config.set({"pescheduler.monitor.interval": interval}):
            with pescheduler.deploy(build("monitor-bench", path, count=count), workers=3,
                                    plugins=["benchops"], policies=[]) as dep:
                status = dep.wait(timeout=600)
        with open(path) as f:
            result = json.load(f)
    check = check_exactly_once(result, emitted_by_source(status))
    assert check["lost"] == check["duplicated"] == check["unknown"] == check["bad_sums"] == 0, check
    return result["count"] / (result["times"][-1] - result["times"][0])


def monitor_overhead(count: int, rounds: int = 3) -> tuple[float, float, list, list]:
    default = dask.config.get("pescheduler.monitor.interval")
    on, off = [], []
    for r in range(rounds):                                  # interleaved, alternating which goes first
        for which in (("on", "off") if r % 2 == 0 else ("off", "on")):
            if which == "on":
                on.append(unthrottled(count, default))
            else:
                off.append(unthrottled(count, "3600s"))
    return max(on), max(off), on, off


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 repetitions and a shorter monitor run (< 1 min)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions of each operation (default 30)")
    parser.add_argument("--rate", type=float, default=200_000, help="source rate under reconfiguration")
    parser.add_argument("--monitor-events", type=int, default=None,
                        help="tuples per unthrottled monitor run (default 3,000,000; --quick 1,000,000)")
    args = parser.parse_args()
    repeat = args.repeat or (5 if args.quick else 30)
    warmup = 1.5 if args.quick else 3.0
    monitor_events = args.monitor_events or (1_000_000 if args.quick else 3_000_000)
    t_begin = time.perf_counter()

    run = reconfigurations(args.rate, repeat, GAP_S, warmup)
    steady, how, dip = dips(run)
    applies = run["applies"]
    single = [a for a in applies if a["kind"] in ("move", "fuse", "split", "split+fuse:split", "split+fuse:fuse")]
    t_first, t_last = run["result"]["times"][0], run["result"]["times"][-1]

    print(f"reconfiguration under load: counter -> map -> key_by -> keyed_sum -> sink, 3 workers, "
          f"source paced to {args.rate:,.0f} tuples/s; {len(single)} applies in {t_last - t_first:.0f} s")
    print(f"  steady rate at the sink ({how}): {steady:,.0f} tuples/s ({steady / args.rate:.2f}x the source rate)")
    print("  busy before the first apply: " + ", ".join(f"{pe} {b:.0%}" for pe, b in run["busy"].items()))
    print(f"  {'operation':<34s} {'n':>3s}  {'pause p50':>9s} {'p99':>7s}  {'apply() p50':>11s} {'p99':>7s}  "
          f"{'dip p50':>7s} {'worst':>6s}  goal: pause p99 <= {PAUSE_GOAL_MS:.0f} ms")
    rows = [("move", "move middle PE (map) across workers"), ("fuse", "fuse adjacent PEs (src + map)"),
            ("split", "split fused PE (src->map)"), ("split+fuse", "split+fuse key_by hot <-> cold PE")]
    for kind, label in rows:
        picked = [(i, a) for i, a in enumerate(applies) if a["kind"] == kind]
        pauses = [a["pause_ms"] for _, a in picked]
        walls = [a["wall_ms"] for _, a in picked]
        ratios = [dip[i] for i, _ in picked]
        per_apply = [p for _, a in picked for p in a.get("parts", (a["pause_ms"],))]
        met = "met" if pct(per_apply, 99) <= PAUSE_GOAL_MS else "NOT met"
        note = " (each apply)" if kind == "split+fuse" else ""
        print(f"  {label:<34s} {len(picked):>3d}  {statistics.median(pauses):7.1f}ms {pct(pauses, 99):5.1f}ms  "
              f"{statistics.median(walls):9.1f}ms {pct(walls, 99):5.1f}ms  {statistics.median(ratios):6.2f}x "
              f"{min(ratios):5.2f}x  {met}{note}")
    pauses = [a["pause_ms"] for a in single]
    walls = [a["wall_ms"] for a in single]
    print(f"  {'every single apply':<34s} {len(single):>3d}  {statistics.median(pauses):7.1f}ms "
          f"{pct(pauses, 99):5.1f}ms  {statistics.median(walls):9.1f}ms {pct(walls, 99):5.1f}ms  "
          f"{'':>7s} {'':>6s}  {'met' if pct(pauses, 99) <= PAUSE_GOAL_MS else 'NOT met'}")
    print(f"  (split+fuse: pause and apply() are the sum of its two applies; dip: lowest {BUCKET_S * 1000:.0f} ms "
          f"bucket from apply start to {DIP_AFTER_S} s after it returned, as a share of the steady rate)")

    c = run["check"]
    print(f"  exactly once: source emitted {c['emitted']:,} numbered tuples, sink received {c['received']:,}; "
          f"out of order within a key {c['out_of_order']} (batches reordered across keys "
          f"{c['reordered']}), wrong keyed sums {c['bad_sums']}, "
          f"dead letters {run['dead_letters']}")
    assert c["emitted"] > 0 and c["lost"] == 0 and c["duplicated"] == 0 and c["unknown"] == 0, c
    assert c["out_of_order"] == 0 and c["bad_sums"] == 0 and run["dead_letters"] == 0, c
    print(f"  {c['lost']} lost, {c['duplicated']} duplicated   (goal: 0 lost, 0 duplicated)")

    best_on, best_off, on, off = monitor_overhead(monitor_events)
    interval = dask.config.get("pescheduler.monitor.interval")
    print(f"monitor overhead: same pipeline unthrottled, {monitor_events:,} tuples, best of {len(on)} each")
    print(f"  monitor.interval {interval:<6s} {best_on / 1e6:6.3f} M tuples/s   "
          f"(runs: {', '.join(f'{x / 1e6:.3f}' for x in on)})")
    print(f"  monitor.interval 3600s  {best_off / 1e6:6.3f} M tuples/s   "
          f"(runs: {', '.join(f'{x / 1e6:.3f}' for x in off)})")
    print(f"  on/off {best_on / best_off:.3f}x: overhead {(1 - best_on / best_off) * 100:+.1f} %")
    print(f"total {time.perf_counter() - t_begin:.0f} s")


if __name__ == "__main__":
    main()

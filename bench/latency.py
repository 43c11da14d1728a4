"""Latency benchmark: event-created -> sink wall-clock latency across PEs on different workers.

    python bench/latency.py [--duration 5] [--quick]

``replay`` stamps each tuple when it is read (``sent``, the host's monotonic
clock), a chain of 2 PEs (``replay`` -> ``latency``) or 3 PEs (``replay`` ->
``map`` -> ``latency``), each PE on its own worker process, carries it; the
sink takes ``now - sent`` per tuple. First each shape's capacity is measured
(unpaced, twice per behaviour, alternating, the best kept), then the latency at
1 k/s, 10 k/s, 50 % and 90 % of the higher of the two behaviours' capacities --
the same offered rates for both, so "throughput at 90 %" asks whether each keeps
up with the same input: p50/p99/p99.9/max and the throughput reached at each.
Every run checks the sink saw every tuple sent (exit 1 if not).

Two channel behaviours in the same run, each in its own processes (so nothing of
one leaks into the other's workers): **before** -- a fixed 5 ms linger after
the oldest buffered tuple or a full batch (issue 34's starting point, loaded as
the ``fixedlinger`` plug-in); **after** -- today's channels with their default
latency target (``pescheduler.batch.latency``): batches sized from the measured
rate to fill in half the target, at most the target's wait.
The fire part: a window firing many keys at once, as a ``burst`` operator in
the middle PE of 3 (``replay`` at 5 k/s -> ``burst`` -> ``latency``) emitting
10^4, 10^5 and 3*10^5 results at once (one batch from one call) one second in;
the tuple right behind the fire waits for all of it, so the latency's max is the
stall the fire puts on every other tuple of its PE, and the results' p50 shows
whether they leave together or as slices. Before: one frame; after: slices of
``batch.size`` (channels.py).

Goals (issue 34, quiet machine): across 2 PEs p99 <= 2 ms at 1 k/s and 10 k/s,
<= 10 ms at 50 % of capacity, <= 50 ms at 90 %; throughput at 90 % no lower
than before.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run(shape: int, rate: float | None, events: int, before: bool) -> dict:
    """One deployment: ``shape`` PEs, ``rate`` tuples/s (None: unpaced); what the sink saw."""
    import pescheduler
    from pescheduler import Application

    every = max(1, events // 200_000)            # at most about 200 k latency samples
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lat.pickle")
        app = Application(f"latency{shape}")
        stream = app.source("replay", events=events, stamp=True, rate=rate)
        if shape == 3:
            stream = stream.map(lambda e: {**e, "hop": 1})
        stream.sink("latency", path=path, every=every)
        plugins = ["benchops"] + (["fixedlinger"] if before else [])
        with pescheduler.deploy(app, workers=shape, plugins=plugins, policies=[]) as dep:
            assert len({pe.worker for pe in dep.placement().pes.values()}) == shape
            dep.wait(timeout=600)
        with open(path, "rb") as f:
            r = pickle.load(f)
    if r["count"] != events:
        print(f"{shape} PEs at {rate}: the sink saw {r['count']} tuples of {events} sent")
        sys.exit(1)
    lat = array("d")
    lat.frombytes(r["latencies"])
    lat = sorted(x * 1000 for x in lat)
    at = lambda q: lat[min(len(lat) - 1, int(len(lat) * q))]  # noqa: E731
    return {"count": r["count"], "tuples_s": r["count"] / max(r["last"] - r["first"], 1e-9),
            "p50": at(0.5), "p99": at(0.99), "p999": at(0.999), "max": lat[-1]}


SHAPES = (2, 3)


def one(before: bool, duration: float, capacities: dict | None, shapes: tuple = SHAPES) -> list[dict] | dict:
    """For one channel behaviour (in its own process, :func:`main`): each shape's capacity when
    ``capacities`` is None, else every shape at 1 k/s, 10 k/s, 50 % and 90 % of its given capacity."""
    if before:
        os.environ["PESCHEDULER__BATCH__LATENCY"] = "5ms"
    if capacities is None:
        return {shape: run(shape, None, 400_000, before)["tuples_s"] for shape in shapes}
    rows = []
    for shape in shapes:
        capacity = capacities[str(shape)]
        for label, rate in (("1k/s", 1_000), ("10k/s", 10_000), ("50%", capacity / 2), ("90%", capacity * 0.9)):
            r = run(shape, rate, max(1000, int(rate * duration)), before)
            rows.append({"shape": shape, "label": label, "rate": rate, "capacity": capacity, **r})
    return rows


FIRES = (10_000, 100_000, 300_000)


def fire(keys: int, before: bool) -> dict:
    """One fire of ``keys`` results in the middle of 3 PEs (module doc): the latencies the sink saw."""
    import pescheduler
    from pescheduler import Application

    events = 10_000
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fire.pickle")
        app = Application("fire")
        (app.source("replay", events=events, stamp=True, rate=5_000)
            .apply("burst", keys=keys, after=5_000)
            .sink("latency", path=path))
        plugins = ["benchops"] + (["fixedlinger"] if before else [])
        with pescheduler.deploy(app, workers=3, plugins=plugins, policies=[]) as dep:
            assert len({pe.worker for pe in dep.placement().pes.values()}) == 3
            dep.wait(timeout=600)
        with open(path, "rb") as f:
            r = pickle.load(f)
    if r["count"] != events + keys:
        print(f"fire of {keys}: the sink saw {r['count']} tuples of {events + keys}")
        sys.exit(1)
    lat = array("d")
    lat.frombytes(r["latencies"])
    lat = sorted(x * 1000 for x in lat)
    return {"keys": keys, "p50": lat[len(lat) // 2], "p999": lat[int(len(lat) * 0.999)], "max": lat[-1]}


def sub(which: str, duration: float, capacities: dict | None = None, fires: tuple = (), shapes: tuple = SHAPES):
    """:func:`one` (or with ``fires`` the fire part, of so many keys) in a fresh process; ``shapes``:
    the numbers of PEs (bench/goals34.py asks only for 2)."""
    cmd = [sys.executable, __file__, "--one", which, "--duration", str(duration),
           "--shapes", ",".join(map(str, shapes))]
    if capacities is not None:
        cmd += ["--capacities", json.dumps(capacities)]
    if fires:
        cmd += ["--fires", ",".join(map(str, fires))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(duration: float, rounds: int, shapes: tuple = SHAPES) -> tuple[dict, dict]:
    """Each shape's capacity for both behaviours (best of ``rounds``, alternating), then both at
    1 k/s, 10 k/s, 50 % and 90 % of the higher: ``(capacity[which][shape], rows[which])``."""
    capacity: dict = {"before": {}, "after": {}}
    for which in ("before", "after") * rounds:
        for shape, found_s in sub(which, duration, shapes=shapes).items():
            capacity[which][shape] = max(found_s, capacity[which].get(shape, 0.0))
    offered = {shape: max(capacity["before"][shape], capacity["after"][shape]) for shape in capacity["before"]}
    return capacity, {which: sub(which, duration, offered, shapes=shapes) for which in ("before", "after")}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per paced run")
    parser.add_argument("--quick", action="store_true", help="short runs, one fire of 10^4 (smoke test)")
    parser.add_argument("--one", choices=["before", "after"], help=argparse.SUPPRESS)
    parser.add_argument("--capacities", type=json.loads, help=argparse.SUPPRESS)
    parser.add_argument("--fires", type=lambda text: [int(k) for k in text.split(",")], help=argparse.SUPPRESS)
    parser.add_argument("--shapes", type=lambda text: tuple(int(n) for n in text.split(",")), default=SHAPES,
                        help=argparse.SUPPRESS)
    parser.add_argument("--fire-only", action="store_true", help="only the fire part")
    args = parser.parse_args()
    fires = FIRES[:1] if args.quick else FIRES
    if args.quick:
        args.duration = 1.0
    if args.one and args.fires:
        print(json.dumps([fire(keys, args.one == "before") for keys in args.fires]))
        return
    if args.one:
        print(json.dumps(one(args.one == "before", args.duration, args.capacities, args.shapes)))
        return
    if args.fire_only:
        return print_fires(os.getloadavg()[0], {which: sub(which, 0, fires=fires) for which in ("before", "after")})
    load = os.getloadavg()[0]
    capacity, found = measure(args.duration, 1 if args.quick else 2)
    print(f"event-created -> sink latency, each PE on its own worker; load {load:.1f} -> "
          f"{os.getloadavg()[0]:.1f} (1-min, 2 cores shared); ms")
    print(f"{'':>8} {'PEs':>3} {'rate':>6} | {'before: p50':>11} {'p99':>7} {'p99.9':>7} {'max':>7} {'k/s':>7} |"
          f" {'after: p50':>10} {'p99':>7} {'p99.9':>7} {'max':>7} {'k/s':>7}")
    for b, a in zip(found["before"], found["after"]):
        cells = [f"{r['p50']:11.2f} {r['p99']:7.2f} {r['p999']:7.2f} {r['max']:7.1f} {r['tuples_s'] / 1e3:7.1f}"
                 for r in (b, a)]
        print(f"{'':>8} {a['shape']:>3} {a['label']:>6} | {cells[0]} | {cells[1]:>}")
    print(f"capacity (unpaced, best of {1 if args.quick else 2}, k tuples/s): " + ", ".join(
        f"{n} PEs before {capacity['before'][str(n)] / 1e3:.0f} after {capacity['after'][str(n)] / 1e3:.0f}"
        for n in SHAPES) + "; 50 % and 90 % are of the higher, for both")
    print("goals across 2 PEs: p99 <= 2 ms at 1k/s and 10k/s, <= 10 ms at 50 %, <= 50 ms at 90 %; "
          "throughput at 90 % no lower than before")
    print_fires(os.getloadavg()[0], {which: sub(which, 0, fires=fires) for which in ("before", "after")})


def print_fires(load: float, fires: dict) -> None:
    print(f"a fire of many keys at once in the middle of 3 PEs, 5 k/s around it; load {load:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; ms (max: the tuple right behind the fire)")
    print(f"{'keys':>8} | {'before: p50':>11} {'p99.9':>7} {'max':>7} | {'after: p50':>10} {'p99.9':>7} {'max':>7}")
    for b, a in zip(fires["before"], fires["after"]):
        print(f"{a['keys']:>8} | {b['p50']:11.2f} {b['p999']:7.1f} {b['max']:7.1f} | "
              f"{a['p50']:10.2f} {a['p999']:7.1f} {a['max']:7.1f}")


if __name__ == "__main__":
    main()

"""Copies follow the heat: load moves from timeframe T1's operator to T2's, and so do the copies.

    python examples/hotspot_cars.py

A connected-car service computes the average speed per car and minute
separately for two half-hour timeframes of event time. Each timeframe has
its own operator (``timeframe-1``, ``timeframe-2``), a costly enrichment. While
the stream is in T1 every event goes through ``timeframe-1``; once it crosses
into T2 the load moves to ``timeframe-2``. A scripted controller (the
``copy`` policy automates the same) looks at every monitor window, puts a
copy of the hot operator on a warm standard slot, and releases it when the
heat has moved on. The live view (on a terminal; plain lines otherwise)
shows the PEs, the standard slots and each decision. At the end the results
are compared with a plain-Python reference: nothing lost, nothing doubled.
"""

import json
import math
import os
import sys
import tempfile

import pescheduler
from pescheduler import Application, Release, Replicate

EVENTS = 240_000                 # one event per ms of event time: 240 s, two timeframes of 120 s
RATE = 30_000                    # events/s, so each timeframe lasts 4 s of wall time
START_TS = 1_700_000_000_000
TIMEFRAME_MS = EVENTS // 2
GENERATOR = dict(events=EVENTS, keys=500, seed=11, rate=RATE, start_ts=START_TS)
HOT = ("timeframe-1", "timeframe-2")
COST_STEPS = 200                 # the enrichment's cost: about 10-20 us of Python per event


def timeframe(event) -> int:
    return (event["ts"] - START_TS) // TIMEFRAME_MS


def enrich(event):
    """A deliberately costly per-event step (think: map matching), then speed in m/s."""
    x = event["ts"]
    for _ in range(COST_STEPS):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    return {"car": event["car"], "ts": event["ts"], "speed": event["speed"] / 3.6, "tile": x % 16}


def build(output_dir: str = "out") -> Application:
    app = Application("hotspot-cars")
    cars = app.source("generator", **GENERATOR)
    for t in (0, 1):
        (cars.filter(lambda e, t=t: timeframe(e) == t, id=f"in-t{t + 1}")
            .map(enrich, id=HOT[t])
            .key_by("car", id=f"by-car-{t + 1}")
            .window(size="60s", aggregates={"avg_speed": ("avg", "speed"), "events": ("count", "speed")}, id=f"avg-{t + 1}")
            .sink("jsonl", path=os.path.join(output_dir, f"t{t + 1}.jsonl"), id=f"out-{t + 1}"))
    return app


def reference() -> dict[str, list[dict]]:
    """The same averages computed by a plain Python loop over the same events."""
    from pescheduler.operators.sources import GeneratorSource

    source = GeneratorSource(**{k: v for k, v in GENERATOR.items() if k != "rate"})
    sums: list[dict] = [{}, {}]
    while (batch := source.read(10_000)) is not None:
        for e in batch:
            start = e["ts"] - e["ts"] % 60_000
            acc = sums[timeframe(e)].setdefault((start, e["car"]), [0.0, 0])
            acc[0] += e["speed"] / 3.6
            acc[1] += 1
    return {f"t{t + 1}": sorted(({"car": c, "window_start": s, "window_end": s + 60_000, "avg_speed": a / n,
                                  "events": n}
                                 for (s, c), (a, n) in sums[t].items()), key=_order)
            for t in (0, 1)}


def _order(row):
    return row["window_start"], row["car"]


def equal(got: list[dict], expected: list[dict]) -> bool:
    """Same windows, cars and event counts (exactly); averages equal up to float rounding. With a copy, one
    car's events reach its window from two instances, so they are summed in another order
    and the last bit of a float sum may differ (every event still counted exactly once)."""
    return len(got) == len(expected) and all(
        g.keys() == e.keys() and _order(g) == _order(e) and g["events"] == e["events"] and math.isclose(g["avg_speed"], e["avg_speed"], rel_tol=1e-12)
        for g, e in zip(got, expected))


def follow_the_heat(dep, say) -> None:
    """Each monitor window: the hot operator gets a copy, a cooled one gives its copy back."""
    while dep.status()["state"] == "running":
        try:
            snap = dep.next_snapshot(timeout=5)
        except TimeoutError:
            continue
        rates = {op: snap.operators[op].tuples_in_per_s for op in HOT if op in snap.operators}
        if len(rates) < 2 or max(rates.values()) == 0:
            continue
        hot = max(rates, key=rates.get)
        for op in HOT:
            copies = len(dep.placement().copies_of(op))
            if op != hot and copies:
                action = Release(op, copies, reason=f"{op} cooled to {rates[op]:,.0f} events/s")
            elif op == hot and not copies:
                action = Replicate(op, 1, reason=f"{op} is hot at {rates[op]:,.0f} events/s")
            else:
                continue
            record = dep.apply(action)
            say(f"{action!r}: applied={record.applied} pause={record.pause_ms:.1f} ms ({action.reason})"
                + ("" if record.applied else f"; refused: {record.reason}"))


def main() -> int:
    out = tempfile.mkdtemp(prefix="hotspot-")
    with pescheduler.deploy(build(out), workers=2, policies=[]) as dep:
        if sys.stdout.isatty():
            from pescheduler.liveview import LiveView

            with LiveView(dep.status) as view:
                follow_the_heat(dep, lambda text: view.console.log(text))
        else:
            follow_the_heat(dep, print)
        dep.wait(timeout=120)
    same = True
    for name, rows in reference().items():
        with open(os.path.join(out, f"{name}.jsonl")) as f:
            got = sorted((json.loads(line) for line in f), key=_order)
        same &= equal(got, rows)
        print(f"{name}: {len(got)} window results")
    print(f"equal to the plain-Python reference: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

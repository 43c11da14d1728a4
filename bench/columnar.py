"""Columnar benchmark: the connected-car pipeline on Arrow batches with col expressions, in one run.

    python bench/columnar.py [--events 2000000] [--repeat 3] [--quick]

Every variant reads the same pre-made events (bench/cars.py; Arrow batches of
65,536 rows for the columnar ones) and its output is checked; figures are
ratios to the hand-written loop over dicts and to numpy over the same columns
(goals: >= 10 M events/s on one core, >= 0.3x numpy):

  hand loop over dicts / over tuples, numpy over columns   (baselines)
  columnar in-process / on one Dask worker (deploy)
  fused per tuple in-process (expressions), for the gap columnar closes
  Arrow IPC channel: values/s of Arrow batches between two worker processes
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pescheduler  # noqa: E402
from pescheduler import Application  # noqa: E402

import cars  # noqa: E402


def arrow_channel(events: int) -> tuple[float, float]:
    """Arrow batches (5 columns) from one worker process to another: (rows/s, values/s)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.json")
        app = Application("arrow-channel")
        app.source("replay", events=events, columnar=True).sink("throughput", path=path)
        with pescheduler.deploy(app, workers=2, plugins=["benchops"], policies=[]) as dep:
            assert len({pe.worker for pe in dep.placement().pes.values()}) == 2
            dep.wait(timeout=600)
        with open(path) as f:
            r = json.load(f)
    rate = r["count"] / max(r["last"] - r["first"], 1e-9)
    return rate, rate * 5


def ipc_codec(events: int = 1_000_000) -> float:
    """Encode+decode of the same Arrow batches in one process (values/s): the channel's ceiling."""
    import benchops
    from pescheduler.worker.channels import decode, encode

    batches = benchops.premade_events(events, True)
    t0 = time.perf_counter()
    for b in batches:
        decode(bytes(encode(b, None)))
    return events * 5 / (time.perf_counter() - t0)


def main() -> None:
    args = cars.arguments(__doc__, 20_000_000)
    n = args.events
    variants = {
        **cars.baselines(n),
        "columnar in-process (Arrow + col)": lambda: cars.in_process(n, columnar=True),
        "columnar on 1 worker (deploy)": lambda: cars.deployed(n, columnar=True),
        "fused per tuple in-process, col expressions": lambda: cars.in_process(n),
    }
    best = cars.measure(variants, args.repeat)
    cars.report(best, n, "hand loop, dicts", "numpy over columns")
    rows, values = arrow_channel(args.channel_events)
    print(f"Arrow IPC channel, 2 worker processes: {rows / 1e6:.2f} M rows/s = {values / 1e6:.1f} M values/s "
          f"(goal >= 50 M values/s); serial encode+decode in one process: {ipc_codec() / 1e6:.1f} M values/s")


if __name__ == "__main__":
    main()

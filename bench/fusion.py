"""Fusion benchmark: the connected-car pipeline per tuple, against the hand loop, in one run.

    python bench/fusion.py [--events 2000000] [--repeat 3] [--quick]

Every variant reads the same pre-made events (bench/cars.py) and its output
is checked; figures are ratios to the hand-written loop over dicts (the same
dict work as the lambda app) and to numpy over the same columns:

  hand loop over dicts / over tuples, numpy over columns   (baselines)
  fused in-process, expressions / lambdas                  (pescheduler.testing: the runtime's chain)
  fused on one Dask worker, expressions / lambdas          (deploy, workers=1)
  unfused: every operator its own PE on its own worker process
  channel: tuples/s of event dicts between two worker processes, latency at half load
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pescheduler  # noqa: E402
from pescheduler import Application  # noqa: E402

import cars  # noqa: E402


def channel(events: int, repeat: int) -> tuple[float, list[float]]:
    """Pre-generated event tuples from one worker process to another: tuples/s, then latency at half load."""
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.json")
        for _ in range(repeat):
            app = Application("channel")
            app.source("replay", events=events).sink("throughput", path=path)
            with pescheduler.deploy(app, workers=2, plugins=["benchops"], policies=[]) as dep:
                assert len({pe.worker for pe in dep.placement().pes.values()}) == 2
                dep.wait(timeout=600)
            r = json.load(open(path))
            rates.append(r["count"] / (r["last"] - r["first"]))
        rate = max(rates)
        app = Application("latency")
        app.source("replay", events=int(rate / 2 * 5), stamp=True, rate=rate / 2).sink("throughput", path=path)
        with pescheduler.deploy(app, workers=2, plugins=["benchops"], policies=[]) as dep:
            dep.wait(timeout=600)
        latencies = json.load(open(path))["latencies"]
    return rate, latencies


def serial_codec(events: int = 200_000) -> float:
    """Baseline for the channel: encode then decode the same event batches in one process (tuples/s)."""
    from pescheduler.worker.channels import decode, encode
    from pescheduler.operators.sources import GeneratorSource

    gen = GeneratorSource(events=events, keys=10_000, seed=1)
    batches = []
    while (batch := gen.read(1000)) is not None:
        batches.append(batch)
    t0 = time.perf_counter()
    for batch in batches:
        decode(encode(batch, lambda item, exc: None))
    return events / (time.perf_counter() - t0)


def main() -> None:
    args = cars.arguments(__doc__, 4_000_000)
    n = args.events
    variants = {
        **cars.baselines(n),
        "fused in-process, col expressions": lambda: cars.in_process(n),
        "fused in-process, lambdas over dicts": lambda: cars.in_process(n, lambdas=True),
        "fused on 1 worker (deploy), col expressions": lambda: cars.deployed(n),
        "fused on 1 worker (deploy), lambdas over dicts": lambda: cars.deployed(n, lambdas=True),
        "unfused, one PE per operator on 6 workers": lambda: cars.deployed(n, workers=6),
    }
    best = cars.measure(variants, args.repeat)
    cars.report(best, n, "hand loop, dicts", "numpy over columns")
    t_hand_tuples = best["hand loop, tuples"]
    print(f"  deployed (expressions) vs hand loop over tuples: {t_hand_tuples / best['fused on 1 worker (deploy), col expressions']:.2f}x; "
          f"fused on a worker vs unfused: {best['unfused, one PE per operator on 6 workers'] / best['fused on 1 worker (deploy), col expressions']:.2f}x")
    codec = max(serial_codec() for _ in range(args.repeat))
    rate, lat = channel(args.channel_events, args.repeat)
    lat_ms = sorted(x * 1000 for x in lat)
    p50 = statistics.median(lat_ms)
    p99 = lat_ms[max(0, int(len(lat_ms) * 0.99) - 1)]
    print(f"channel, 2 worker processes, event dicts: {rate / 1e6:.2f} M tuples/s (goal >= 2.0 M), "
          f"{rate / codec:.2f}x the serial pickle encode+decode of the same batches in one process "
          f"({codec / 1e6:.2f} M/s, this run)")
    print(f"  at half load, per-batch latency p50 {p50:.2f} ms, p99 {p99:.2f} ms (goal <= 10 ms)")


if __name__ == "__main__":
    main()

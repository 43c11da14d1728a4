"""Elastic sizing on lab hosts: one hot operator at 1.25x one core, default policies, how fast and how exact.

    python bench/elastic.py [--quick] [--cost-us MICROSECONDS] [--load 1.25] [--seconds S]

Pipeline (bench/benchops.py operators): ``counter`` paced to the offered rate
-> ``burn`` (a STATELESS map spending about ``--cost-us`` of pure-Python CPU
per tuple) -> ``arrivals`` (every number seen, duplicates counted), on a
2-worker embedded cluster with the ``lab`` resource manager (hosts: network
namespaces with a 1-core cgroup quota each; needs root) and the default
policies (``rate`` + ``copy``). The offered rate is ``--load`` times what
``burn`` processes per CPU second, calibrated in this process first, so the
oracle size is ``ceil(load)`` instances (2 for 1.25x).

Printed, from this one run:

  steps                applied scaling actions on ``burn`` and host borrows
                       (DS2 reports <= 3 steps to converge, Dhalion 6)
  instances            of ``burn`` at the end and at the peak, vs the oracle
  over-provisioning    instances at the end beyond the oracle (goal <= 1)
  relief               first monitor window from which the source is not held
                       back by backpressure (< 10 %) for two windows in a row:
                       its end in seconds, and which window it is counted from
                       the first decision (goal: the 1st or 2nd)
  hosts                lab hosts borrowed and returned
  activation           per copy: decision -> its first processed batch
  exactly once         every number reached the sink once (lost, duplicated)

On this 2-core machine every lab host's quota is carved from the same two
cores the embedded workers use, so the figures show the policies' behaviour
on real quotas, not extra hardware.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dask.config  # noqa: E402
from dask.utils import parse_timedelta  # noqa: E402

import pescheduler  # noqa: E402
from pescheduler import Application  # noqa: E402
from pescheduler.actions import BorrowHosts, Move, Release, Replicate  # noqa: E402
from parallel import make_burn  # noqa: E402

RELIEVED_BP = 0.1          # a source blocked less than this is not held back
SCALING = (Replicate, Release, BorrowHosts, Move)


def cpu_rate(burn, n: int = 5_000) -> float:
    """Tuples ``burn`` processes per CPU second of this thread."""
    t0 = time.thread_time()
    for i in range(n):
        burn({"n": i})
    return n / (time.thread_time() - t0)


def build(burn, offered: float, out: str) -> Application:
    app = Application("bench-elastic")
    (app.source("counter", id="src", keys=100, rate=offered)
        .map(burn, id="burn")
        .sink("arrivals", id="sink", path=out))
    return app


def relief(windows: list[tuple[float, float]]) -> float | None:
    """Seconds from the start to the first of two windows in a row with the source unblocked."""
    for (t, bp), (_t2, bp2) in zip(windows, windows[1:]):
        if bp < RELIEVED_BP and bp2 < RELIEVED_BP:
            return t
    return None


def run(cost_us: float, load: float, seconds: float, interval: str) -> dict:
    burn = make_burn(cost_us)
    rate = cpu_rate(burn)
    offered = load * rate
    out = os.path.join(tempfile.mkdtemp(prefix="bench-elastic-"), "arrivals.json")
    settings = {"pescheduler.monitor.interval": interval, "pescheduler.rm.lab.cpu": 1.0,
                "pescheduler.policies.decision-log": None}
    with dask.config.set(settings):
        with pescheduler.deploy(build(burn, offered, out), workers=2, plugins=["benchops"], rm="lab") as dep:
            first = dep.next_snapshot(timeout=60)
            t0, windows, peak = first.time, [], 1
            while time.monotonic() - t0 < seconds:
                snap = dep.next_snapshot(timeout=30)
                src = snap.pes.get(dep.placement().pe_of("src"))
                if src is not None:
                    windows.append((snap.time - t0, src.backpressure))
                peak = max(peak, len(dep.placement().instances("burn")))
            instances = len(dep.placement().instances("burn"))
            decisions = [d for d in dep.controller.decisions if d.outcome == "applied" and isinstance(d.action, SCALING)]
            others = [f"t={d.t - t0:.1f}s {d.text()}" for d in dep.controller.decisions if d.outcome != "applied"]
            timeline = list(dep.hosts.timeline)
            activations = dep.activations()
            budget = dep.resources().budget
            dep.stop()                                  # drain: what the source emitted reaches the sink
            sent = dep.snapshot().operators["src"].tuples_out
    with open(out) as f:
        arrivals = json.load(f)
    first_decision = min((d.t - t0 for d in decisions), default=None)
    return {"rate": rate, "offered": offered, "oracle": math.ceil(load - 1e-9), "instances": instances,
            "peak": peak, "steps": [(round(d.t - t0, 1), repr(d.action)) for d in decisions],
            "relief_s": relief(windows), "first_decision_s": first_decision, "count": sent,
            "arrivals": arrivals, "timeline": timeline, "activations": activations, "budget": budget,
            "interval_s": parse_timedelta(interval), "windows": windows, "others": others}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (20 s of stream)")
    parser.add_argument("--cost-us", type=float, default=100.0, help="CPU per tuple in the hot operator")
    parser.add_argument("--load", type=float, default=1.25, help="offered rate, in multiples of one core's")
    parser.add_argument("--seconds", type=float, default=None, help="how long the load is offered")
    parser.add_argument("--verbose", action="store_true", help="also print the decisions not applied")
    args = parser.parse_args()
    seconds = args.seconds or (20.0 if args.quick else 90.0)
    interval = "1s"
    r = run(args.cost_us, args.load, seconds, interval)
    iv = r["interval_s"]
    runs, a = r["arrivals"]["runs"], r["arrivals"]
    seen = sum(e - s for s, e in runs)
    print(f"hot STATELESS operator, ~{args.cost_us:.0f} us/tuple = {r['rate'] / 1e3:.1f} k tuples per CPU second; "
          f"offered {r['offered'] / 1e3:.1f} k/s = {args.load:.2f}x one core; lab hosts of "
          f"{r['budget'].get('cpu_per_host')} core; monitor interval {iv:g} s; {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"  steps                {len(r['steps'])}   (DS2 reports <= 3, Dhalion 6)   "
          + ", ".join(f"t={t}s {a_}" for t, a_ in r["steps"]))
    print(f"  instances            {r['instances']} at the end, {r['peak']} at the peak; oracle {r['oracle']} "
          f"(offered / per-CPU-second rate, rounded up)")
    over = r["instances"] - r["oracle"]
    print(f"  over-provisioning    {over:+d} instance(s)   goal <= 1: {'met' if over <= 1 else 'not met'}")
    if r["relief_s"] is None:
        print("  relief               not relieved (the source stayed backpressured)")
    else:
        # monitor windows that end after the first decision, up to the first relieved one: the
        # window in which relief happened counts, whatever part of it was still held back
        k = sum(1 for t, _bp in r["windows"] if (r["first_decision_s"] or 0.0) < t <= r["relief_s"])
        print(f"  relief               {r['relief_s']:.1f} s from the start: monitor window {k} after the first "
              f"decision is the first not held back   goal <= 2: {'met' if k <= 2 else 'not met'}")
    borrowed = [e["host"] for e in r["timeline"] if e["what"] == "borrowed"]
    returned = [e["host"] for e in r["timeline"] if e["what"] == "returned"]
    print(f"  hosts                borrowed {', '.join(borrowed) or 'none'}; returned {', '.join(returned) or 'none'}")
    print("  activation           " + (", ".join(f"{c} {ms:.0f} ms" for c, ms in r["activations"].items())
                                      or "no copy") + "   (decision -> first batch processed by the copy)")
    lost, dup = r["count"] - seen, a["duplicates"]
    print(f"  exactly once         {r['count']} sent, {lost} lost, {dup} duplicated")
    if args.verbose:
        print("  not applied:\n    " + "\n    ".join(r["others"][:20]))
    print("  windows (s: source backpressure)  " + " ".join(f"{t:.0f}:{bp:.2f}" for t, bp in r["windows"]))
    if lost or dup:
        sys.exit(1)


if __name__ == "__main__":
    main()

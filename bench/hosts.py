"""Hosts benchmark: borrowing a host and giving it back under a steady stream, local and Spark.

    python bench/hosts.py [--quick] [--rm local|spark|both] [--rounds N] [--rate TUPLES_PER_S]

Pipeline (bench/benchops.py operators): counter (paced to ``--rate``) -> key_by
-> keyed_sum (state that moves) -> arrivals (records each batch's arrival
time and every number seen), on a 2-worker embedded cluster; the PE holding
the sink is the one that travels. Each round:

  1. ``BorrowHosts(1)``; then ``Move`` of the sink's PE onto the new host.
  2. The cluster manager wants the host back: for ``local`` the demand
     callable asks for it within 10 s; for ``spark`` a one-task batch job of
     the same Spark application finds no free slot (``max-executors`` 1).
  3. pescheduler moves the PE off and returns the host; for spark the batch
     job then runs on that executor and ends, and the host is lendable again.

Printed, per resource manager (p50 and max over the rounds):

  borrow -> host joined        wall time of ``dep.apply(BorrowHosts(1))``
  borrow -> first tuple there  from the borrow to the first batch the sink
                               processed on the new host (the end of the
                               largest arrival gap of the move onto it)
  demand -> return requested   from the demand (the local callable's call,
                               the batch job's submission) to the event
  return requested -> returned from ``HostReturnRequested`` to the host given
                               back (the controller's timeline), and whether
                               the deadline was met
  streaming pause              per move (onto the host and off it): the
                               protocol's pause (``ApplyRecord.pause_ms``) and
                               the largest gap between batches at the sink
  exactly once                 every number reached the sink once, in order
                               per key, keyed sums exact (the order across
                               keys may change at a move: the tuples of a key
                               group whose state is on its way wait for it)

For spark the first borrow starts an executor JVM (cold); later rounds
reuse the idle executor while ``executor-idle-timeout`` (30 s here) keeps it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dask.config  # noqa: E402
import psutil  # noqa: E402

import pescheduler  # noqa: E402
from pescheduler import Application, BorrowHosts, Move, ReturnHost  # noqa: E402
from reconfig import check_exactly_once, emitted_by_source  # noqa: E402

KEYS = 100
GAP_S = 1.0                 # steady stream between two steps
WAIT_S = 120.0              # bound on every wait
RETURN_WITHIN_S = 10.0


def build(path: str, rate: float) -> Application:
    app = Application("hosts-bench")
    (app.source("counter", id="src", keys=KEYS, rate=rate)
        .key_by("key", id="key")
        .apply("keyed_sum", id="sum")
        .sink("arrivals", id="sink", path=path, keys=KEYS))
    return app


def until(predicate, what: str, timeout: float = WAIT_S) -> None:
    """Poll ``predicate`` (no event exists for these) until true, or stop the benchmark saying why."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def applied(dep, action, timeout: float = WAIT_S):
    t0 = time.time()
    rec = dep.apply(action, timeout=timeout)
    if not rec.applied:
        raise SystemExit(f"{action!r} was not applied: {rec.reason}")
    return rec, t0, time.time()


class LocalDemand:
    """The local RM's demand callable: hands its control and loop to the benchmark's thread."""

    def __init__(self) -> None:
        self.ready = threading.Event()

    def __getstate__(self) -> dict:
        return {}           # Dask ships its config (this included) to spawned workers: nothing to carry

    def __setstate__(self, state: dict) -> None:
        self.ready = threading.Event()

    async def __call__(self, control) -> None:
        self.control, self.loop = control, asyncio.get_running_loop()
        self.ready.set()

    def want_back(self, dep) -> None:
        asyncio.run_coroutine_threadsafe(self.control.want(1, RETURN_WITHIN_S), self.loop).result(10)

    def after(self, dep) -> None:
        self.control.free(1)


class SparkDemand:
    """A one-task batch job of the deployment's own Spark application."""

    def want_back(self, dep) -> None:
        sc = dep.hosts.rm.sc

        def job() -> None:
            sc.setJobGroup("bench-batch", "a batch job", interruptOnCancel=True)
            sc.parallelize([0], 1).map(lambda x: time.sleep(0.5) or x).collect()
        self.thread = threading.Thread(target=job, daemon=True)
        self.thread.start()

    def after(self, dep) -> None:
        self.thread.join(WAIT_S)
        until(lambda: dep.resources().lendable >= 1, "Spark to have a free slot again")


def rounds(rm: str, n: int, rate: float) -> dict:
    demand = LocalDemand() if rm == "local" else SparkDemand()
    settings = {"pescheduler.rm.local.hosts": 1, "pescheduler.rm.local.demand": demand,
                "pescheduler.rm.local.oversubscribe": True,       # a host beyond the cores here: a demo
                "pescheduler.rm.spark": {"workers": 1, "max-executors": 1, "executor-idle-timeout": "30s",
                                         "return-within": f"{RETURN_WITHIN_S}s"},
                "pescheduler.monitor.interval": "200ms", "pescheduler.policies.default": []}
    runs = []
    with tempfile.TemporaryDirectory() as tmp, dask.config.set(settings):
        path = os.path.join(tmp, "arrivals.json")
        with pescheduler.deploy(build(path, rate), workers=2, rm=rm, plugins=["benchops"]) as dep:
            t_ready = time.monotonic()
            until(lambda: dep.resources().lendable >= 1, f"the {rm} resource manager to start", 180)
            rm_start = time.monotonic() - t_ready
            sink = next(p for p, pe in dep.placement().pes.items() if "sink" in pe.operators)
            for _ in range(n):
                runs.append(one_round(dep, demand, sink))
            timeline = list(dep.hosts.timeline)
            spark = getattr(dep.hosts.rm, "cluster", None)
            pids = spark.pids() if spark else []
            status = dep.stop()
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        with open(path) as f:
            result = json.load(f)
    return {"rm": rm, "runs": runs, "timeline": timeline, "result": result, "rm_start_s": rm_start,
            "spark_pids": (len(pids), left),
            "check": check_exactly_once(result, emitted_by_source(status))}


def one_round(dep, demand, sink: str) -> dict:
    borrow, b0, b1 = applied(dep, BorrowHosts(1, reason="bench"))
    (host_id,) = [h for h in dep.hosts.borrowed]
    move_on, m0, m1 = applied(dep, Move(sink, dep.hosts.borrowed[host_id].workers[0]))
    time.sleep(GAP_S)                        # steady stream on the borrowed host
    n_records = len(dep.records())
    w0 = time.monotonic()
    demand.want_back(dep)
    until(lambda: any(isinstance(r.action, ReturnHost) for r in dep.records()[n_records:]),
          f"{host_id} to be returned")
    ret = next(r for r in dep.records()[n_records:] if isinstance(r.action, ReturnHost))
    move_off = next(r for r in dep.records()[n_records:] if isinstance(r.action, Move))
    demand.after(dep)
    time.sleep(GAP_S)
    return {"host": host_id, "borrow_s": b1 - b0, "b0": b0, "move_on": (m0, m1, move_on.pause_ms),
            "move_off": (move_off.at - move_off.pause_ms / 1000, move_off.at, move_off.pause_ms),
            "returned": ret, "w0": w0}


def largest_gap(times: list[float], t0: float, t1: float) -> tuple[float, float]:
    """(gap in seconds, time of the batch that ended it) among arrivals in ``[t0, t1]``."""
    inside = [t for t in times if t0 - 1.0 <= t <= t1 + 0.5]
    gaps = [(b - a, b) for a, b in zip(inside, inside[1:]) if b >= t0]
    return max(gaps) if gaps else (0.0, t1)


def figures(run: dict) -> dict:
    times = run["result"]["times"]
    out = {"borrow": [], "first": [], "noticed": [], "returned": [], "late": [], "pause": [], "gap": []}
    requested = [e for e in run["timeline"] if e["what"] == "return-requested"]
    returned = [e for e in run["timeline"] if e["what"] == "returned"]
    for r, req, ret in zip(run["runs"], requested, returned):
        out["borrow"].append(r["borrow_s"])
        for (t0, t1, pause) in (r["move_on"], r["move_off"]):
            gap, _end = largest_gap(times, t0, t1)
            out["pause"].append(pause)
            out["gap"].append(gap * 1000)
        _gap, first = largest_gap(times, *r["move_on"][:2])
        out["first"].append(first - r["b0"])
        out["noticed"].append(req["t"] - r["w0"])
        out["returned"].append(ret["t"] - req["t"])
        out["late"].append(ret["late_s"])
    return out


def line(label: str, values: list[float], unit: str, scale: float = 1.0, extra: str = "") -> str:
    if not values:
        return f"  {label:<30} (none)"
    v = [x * scale for x in values]
    return f"  {label:<30} p50 {statistics.median(v):8.1f} {unit}   max {max(v):8.1f} {unit}{extra}"


def report(run: dict) -> None:
    f, c = figures(run), run["check"]
    cold = f"   (first {f['borrow'][0]:.1f} s)" if run["rm"] == "spark" else ""
    met = sum(1 for x in f["late"] if x <= 0)
    print(f"{run['rm']}: {len(run['runs'])} rounds; resource manager ready after {run['rm_start_s']:.1f} s")
    print(line("borrow -> host joined", f["borrow"], "s", extra=cold))
    print(line("borrow -> first tuple there", f["first"], "s"))
    print(line("demand -> return requested", f["noticed"], "ms", 1000))
    print(line("return requested -> returned", f["returned"], "ms", 1000,
               f"   (deadline {RETURN_WITHIN_S:.0f} s met {met}/{len(f['late'])})"))
    print(line("streaming pause (protocol)", f["pause"], "ms"))
    print(line("streaming pause (sink gap)", f["gap"], "ms"))
    print(f"  exactly once: {c['received']} tuples, {c['lost']} lost, {c['duplicated']} duplicated, "
          f"{c['out_of_order']} out of order within a key, {c['bad_sums']} bad sums "
          f"({c['reordered']} batches reordered across keys)")
    if run["rm"] == "spark":
        started, left = run["spark_pids"]
        print(f"  spark processes started here: {started}, left after stop: {len(left)} {left or ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round per resource manager")
    parser.add_argument("--rm", choices=("local", "spark", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per resource manager (default 5)")
    parser.add_argument("--rate", type=float, default=20_000, help="source rate, tuples/s")
    args = parser.parse_args()
    n = args.rounds or (1 if args.quick else 5)
    print(f"hosts benchmark: {n} round(s), stream at {args.rate:,.0f} tuples/s, "
          f"return deadline {RETURN_WITHIN_S:.0f} s")
    failed = False
    for rm in (("local", "spark") if args.rm == "both" else (args.rm,)):
        run = rounds(rm, n, args.rate)
        report(run)
        c = run["check"]
        failed |= bool(c["lost"] or c["duplicated"] or c["unknown"] or c["out_of_order"] or c["bad_sums"]
                       or run.get("spark_pids", (0, []))[1])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

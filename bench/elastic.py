"""Elastic sizing on lab hosts: a step load on one hot operator, default policies; how fast, how stable, how exact.

    python bench/elastic.py [--quick] [--steps 1,2.5,1] [--phase-seconds S] [--host-cpu 0.5] [--cost-us US]
                            [--policy NAME ...]
    python bench/elastic.py --steps 2.5 --phase-seconds 600      # the 10-minute steady soak (flip-flops)

Pipeline (bench/benchops.py operators): ``schedule`` paced by the load phases
-> ``burn`` (a STATELESS map spending about ``--cost-us`` of pure-Python CPU
per tuple) -> ``arrivals`` (every number seen, duplicates counted), on a
2-worker embedded cluster with the ``lab`` resource manager (hosts: network
namespaces with a ``--host-cpu`` cgroup quota each; needs root) and the
default policies (``rate`` + ``copy``; ``--policy`` names others, repeatable:
``--policy rate --policy copy --policy move``). The load unit is one lab host's
capacity: ``--host-cpu`` times what ``burn`` processes per CPU second,
calibrated in this process first; ``--steps 1,2.5,1`` offers 1x, then 2.5x,
then 1x of it, ``--phase-seconds`` each. The oracle size of a phase is the
fewest instances whose cores hold its work (offered rate over the
per-CPU-second rate): the original's (a core on the embedded cluster) and a
lab host's quota per copy, added up since ``burn``'s batches go by credit.

Printed, per phase and in total:

  steps                applied scaling actions on ``burn`` and host borrows
                       and returns (DS2 reports <= 3 steps to converge, Dhalion 6)
  instances            of ``burn`` at the end of the phase and at its peak, vs
                       the phase's oracle (goal: never more than one over)
  relief               the first monitor window, counted from the phase's first
                       sizing step of ``burn``, that starts two in a row in
                       which the source keeps its schedule: its lag (due but not
                       emitted, ``schedule``'s ``lag()``) grows by less than 5 %
                       of the offered rate, and keeps it to the phase's end
                       (goal: the 1st or 2nd); then the
                       backlog left and whether backpressure fell under 0.10
                       (headroom) or stayed (the offered rate carried at capacity)
  carried              in a phase held back: what each instance processed over
                       its last windows, busy fraction and host CPU (an instance
                       whose host has no core left for it carries a fraction of
                       what the oracle counts on)
  flip-flops           changes of direction of ``burn``'s instance count inside
                       a phase, whose load does not change (goal 0)
  hosts                lab hosts borrowed and returned, with times
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
from pescheduler.actions import BorrowHosts, Move, Release, Replicate, ReturnHost  # noqa: E402
from parallel import make_burn  # noqa: E402

RELIEVED_BP = 0.1          # a source blocked less than this has headroom: it never waits for credit
KEEPS_UP = 0.05            # a source whose lag grows by less than this share of its offered rate keeps its schedule
SCALING = (Replicate, Release, BorrowHosts, ReturnHost, Move)
TAIL_S = 60.0              # the schedule's last phase runs on this long, so a stop (not the end) drains it


def cpu_rate(burn, n: int = 5_000) -> float:
    """Tuples ``burn`` processes per CPU second of this thread."""
    t0 = time.thread_time()
    for i in range(n):
        burn({"n": i})
    return n / (time.thread_time() - t0)


def build(burn, phases: list[tuple[float, float]], out: str) -> Application:
    app = Application("bench-elastic")
    (app.source("schedule", id="src", keys=100, phases=phases)
        .map(burn, id="burn")
        .sink("arrivals", id="sink", path=out))
    return app


def relief(windows: list[dict], since: float, held=lambda w: w["bp"] >= RELIEVED_BP,
           lasting=lambda a, z: True) -> int | None:
    """Which monitor window after ``since`` (1 = the first ending after it) starts two in a row
    in which the source is not ``held`` back, and from which it stays so to the last window
    (``lasting(that window, the last)``); None when none does."""
    after = [w for w in windows if w["t"] > since]
    for k, (a, b) in enumerate(zip(after, after[1:]), start=1):
        if not held(a) and not held(b) and lasting(a, after[-1]):
            return k
    return None


def behind(offered: float):
    """Is the source held back behind its offered rate in a window: its lag (what its schedule
    had due but it had not emitted) growing by more than ``KEEPS_UP`` of the offered rate?"""
    return lambda w: w["lag_per_s"] > KEEPS_UP * offered


def kept_up(offered: float):
    """Did the source keep its schedule from window ``a`` to window ``z``: its lag grew by less
    than ``KEEPS_UP`` of the offered rate over that time? (A copy's start drains the tuples queued
    for it at once, and the lag falls for two windows before it grows again: that is no relief.)"""
    return lambda a, z: z["lag"] - a["lag"] <= KEEPS_UP * offered * (z["t"] - a["t"])


def carried(ws: list[dict], offered: float) -> str:
    """What each instance of ``burn`` processed over the phase's last windows, with its busy
    fraction and host: whether the instances had the cores the oracle counts on (an original on a
    host with no CPU left processes a fraction of what its core would)."""
    if not ws:
        return "no window"
    per: dict[str, list] = {}
    for w in ws:
        for i, (tin, busy, host) in w["burn"].items():
            per.setdefault(i, []).append((tin, busy, host))
    parts = [f"{i} {sum(t for t, _b, _h in v) / len(ws) / 1e3:.1f} k/s at busy {sum(b for _t, b, _h in v) / len(ws):.2f}"
             f" @{v[-1][2] or '-'} (CPU {max(w['hosts'].get(v[-1][2], 0.0) for w in ws):.2f})" for i, v in per.items()]
    total = sum(t for v in per.values() for t, _b, _h in v) / len(ws)
    return f"{', '.join(parts)}: {total / 1e3:.1f} of {offered / 1e3:.1f} k/s offered (last {len(ws)} windows)"


def flip_flops(counts: list[int]) -> int:
    """Changes of direction in a sequence of instance counts (up then down, or down then up)."""
    moves = [b - a for a, b in zip(counts, counts[1:]) if b != a]
    return sum(1 for a, b in zip(moves, moves[1:]) if (a > 0) != (b > 0))


def run(cost_us: float, steps: list[float], phase_s: float, host_cpu: float, interval: str,
        policies: list[str] | None = None) -> dict:
    burn = make_burn(cost_us)
    rate = cpu_rate(burn)
    unit = host_cpu * rate
    phases = [(phase_s, s * unit) for s in steps]
    schedule = phases[:-1] + [(phase_s + TAIL_S, phases[-1][1])]
    out = os.path.join(tempfile.mkdtemp(prefix="bench-elastic-"), "arrivals.json")
    settings = {"pescheduler.monitor.interval": interval, "pescheduler.rm.lab.cpu": host_cpu,
                "pescheduler.policies.decision-log": None}
    total = phase_s * len(steps)
    with dask.config.set(settings):
        with pescheduler.deploy(build(burn, schedule, out), workers=2, plugins=["benchops"], rm="lab",
                               policies=policies) as dep:
            windows = []
            t0 = None
            while t0 is None or time.monotonic() - t0 < total:
                snap = dep.next_snapshot(timeout=60)
                src = snap.operators.get("src")
                if t0 is None:
                    if not src or not src.tuples_out:
                        continue                    # the schedule starts with the first read
                    t0 = snap.time - parse_timedelta(interval)
                windows.append(window(snap, dep.placement(), t0))
            decisions = [d for d in dep.controller.decisions if d.outcome == "applied" and isinstance(d.action, SCALING)]
            others = [f"t={d.t - t0:.1f}s {d.text()}" for d in dep.controller.decisions if d.outcome != "applied"]
            figures = [f"t={d.t - t0:.1f}s {d.policy} {d.action!r}: {dict(d.action.figures)}" for d in decisions]
            records = [f"{r.action!r}: pause {r.pause_ms:.1f} ms, steps {r.steps}" for r in dep.records()
                       if r.applied and isinstance(r.action, Replicate)]
            timeline = list(dep.hosts.timeline)
            activations = dep.activations()
            budget = dep.resources().budget
            dep.stop()                                  # drain: what the source emitted reaches the sink
            sent = dep.snapshot().operators["src"].tuples_out
    with open(out) as f:
        arrivals = json.load(f)
    return {"rate": rate, "unit": unit, "host_cpu": host_cpu, "phases": phases, "steps_x": steps, "phase_s": phase_s, "t0": t0,
            "decisions": [(d.t - t0, d.action) for d in decisions], "windows": windows, "count": sent,
            "arrivals": arrivals, "timeline": timeline, "activations": activations, "budget": budget,
            "others": others, "figures": figures, "records": records}


def window(snap, placement, t0: float) -> dict:
    """What one monitor window showed: the source's backpressure and rate, ``burn``'s instances,
    per instance its rate per busy (CPU) second, busy fraction and host, and each host's CPU."""
    pe = snap.pes.get(placement.pe_of("src"))
    src = snap.operators.get("src")
    burns = {i: snap.operators[i] for i in placement.instances("burn") if i in snap.operators}
    return {"t": snap.time - t0, "bp": pe.backpressure if pe else 0.0, "n": len(placement.instances("burn")),
            "src_out": src.tuples_out_per_s if src else 0.0,
            "lag": sum(src.lag.values()) if src else 0, "lag_per_s": src.lag_per_s if src else 0.0,
            "burn": {i: (m.tuples_in_per_s, m.busy, placement.pes[placement.pe_of(i)].host) for i, m in burns.items()},
            "per_batch": {i: m.tuples_in_per_s / m.batches_in_per_s for i, m in burns.items() if m.batches_in_per_s},
            "cores": getattr(snap.workers.get(placement.pes[placement.pe_of("burn")].worker), "cores", 1.0),
            "hosts": {h: m.cpu for h, m in snap.hosts.items()},
            "pes": {p: ("+".join(m.operators), m.busy, m.backpressure, m.idle, m.queue_batches)
                    for p, m in snap.pes.items()}}


def report(r: dict, verbose: bool) -> None:
    windows, phase_s = r["windows"], r["phase_s"]
    total_flips = 0
    for i, (x, (_s, offered)) in enumerate(zip(r["steps_x"], r["phases"])):
        lo, hi = i * phase_s, (i + 1) * phase_s
        ws = [w for w in windows if lo < w["t"] <= hi]
        acts = [(t, a) for t, a in r["decisions"] if lo <= t < hi]
        # DS2's oracle counts cores (offered / per-CPU-second rate); in instances: the original's
        # cores, then a lab host's quota per copy (by credit, the instances' cores add up)
        cores, work = (ws[-1]["cores"] if ws else 1.0), offered / r["rate"]
        oracle = 1 + max(0, math.ceil((work - cores) / r["host_cpu"] - 1e-9))
        end = ws[-1]["n"] if ws else 0
        peak = max((w["n"] for w in ws), default=0)
        flips = flip_flops([w["n"] for w in ws])
        total_flips += flips
        first = min((t for t, _a in acts), default=lo)
        # relief counts from the phase's first sizing step of burn (a borrow before it is the
        # lender's start-up time, printed with it)
        sized = min((t for t, a in acts if isinstance(a, (Replicate, Release))), default=first)
        late = behind(offered)
        inner = [w for w in ws if w["t"] <= hi - 1.0]      # the last window may straddle the next step
        held = any(late(w) for w in inner)
        k = relief(inner, sized, late, kept_up(offered))
        k_bp = relief(inner, sized)
        print(f"phase {i + 1}: {x:g}x one host = {offered / 1e3:.1f} k/s for {phase_s:.0f} s   oracle {oracle} "
              f"instance(s): the original's {cores:g} core + copies of {r['host_cpu']:g} ({work:.2f} cores of work)")
        print(f"  steps                {len(acts)}   (DS2 reports <= 3, Dhalion 6)   "
              + (", ".join(f"t={t:.1f}s {a!r}" for t, a in acts) or "none"))
        print(f"  instances            {end} at the end, {peak} at the peak; oracle {oracle}   "
              f"over-provisioning {end - oracle:+d}, goal <= 1: {'met' if end - oracle <= 1 else 'not met'}")
        after = [w for w in inner if w["t"] > sized]
        if not held:
            print("  relief               never held back behind its offered rate in this phase")
        elif not acts:
            print("  relief               held back behind its offered rate, and no sizing step was taken")
        elif k is None:
            print("  relief               not relieved (the source's lag kept growing, or grew again)")
        else:
            print(f"  relief               monitor window {k} after the first sizing step (t={sized:.1f}s"
                  + (f", {sized - first:.1f} s after the phase's first decision" if sized > first else "")
                  + f") starts two in a row keeping the schedule and it is kept to the phase's end "
                  f"(lag growth < {KEEPS_UP:.0%} of offered)   "
                  f"goal <= 2: {'met' if k <= 2 else 'not met'}")
        if held:
            since = after[k - 1:] if k else after
            mean_bp = sum(w["bp"] for w in since) / max(1, len(since))
            print(f"  backlog              {ws[-1]['lag']} tuples behind at the end of the phase; "
                  + (f"backpressure under {RELIEVED_BP:.2f} from window {k_bp}" if k_bp else
                     f"backpressure stayed >= {RELIEVED_BP:.2f} (mean {mean_bp:.2f} "
                     + ("once relieved: the instances carry the offered rate with no headroom)" if k else
                        "after the sizing step)")))
            print("  carried              " + carried(ws[-5:], offered))
        print(f"  flip-flops           {flips}   goal 0")
    borrowed = [f"{e['host']}" for e in r["timeline"] if e["what"] == "borrowed"]
    returned = [f"{e['host']}" for e in r["timeline"] if e["what"] == "returned"]
    print(f"hosts                  borrowed {', '.join(borrowed) or 'none'}; returned {', '.join(returned) or 'none'}")
    print("activation             " + (", ".join(f"{c} {ms:.0f} ms" for c, ms in r["activations"].items())
                                      or "no copy") + "   (decision -> first batch processed by the copy)")
    print(f"flip-flops             {total_flips} in all")
    runs, a = r["arrivals"]["runs"], r["arrivals"]
    seen = sum(e - s for s, e in runs)
    lost, dup = r["count"] - seen, a["duplicates"]
    print(f"exactly once           {r['count']} sent, {lost} lost, {dup} duplicated")
    if verbose:
        print("not applied:\n  " + "\n  ".join(r["others"][:40]))
        print("applied, with the figures they were decided on:\n  " + "\n  ".join(r["figures"]))
        print("replications (protocol):\n  " + "\n  ".join(r["records"]))
        print("windows (t: source out/s bp | burn instance in/s busy rate-per-busy-s @host tuples/batch | host cpu)")
        for w in windows:
            inst = " ".join(f"{i} {tin:.0f}/s {busy:.2f} {tin / busy if busy else 0:.0f}@{host or '-'}"
                            f" {w['per_batch'].get(i, 0):.1f}/b" for i, (tin, busy, host) in w["burn"].items())
            hosts = " ".join(f"{h or '-'}:{c:.2f}" for h, c in w["hosts"].items())
            print(f"  {w['t']:5.1f}: {w['src_out']:.0f}/s bp {w['bp']:.2f} lag {w['lag']} ({w['lag_per_s']:+.0f}/s)"
                  f" | {inst} | {hosts}")
            print("         PEs (busy bp idle queue): " + "  ".join(
                f"{ops} {b:.2f} {bp:.2f} {i:.2f} {q}" for ops, b, bp, i, q in w["pes"].values()))
    print("windows (s: source backpressure/instances)  "
          + " ".join(f"{w['t']:.0f}:{w['bp']:.2f}/{w['n']}" for w in windows))
    if lost or dup:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases (12 s each)")
    parser.add_argument("--steps", default="1,2.5,1", help="offered load per phase, in multiples of one lab host")
    parser.add_argument("--phase-seconds", type=float, default=None, help="length of each phase (default 60, quick 12)")
    parser.add_argument("--host-cpu", type=float, default=0.5, help="cores of CPU quota per lab host")
    parser.add_argument("--cost-us", type=float, default=100.0, help="CPU per tuple in the hot operator")
    parser.add_argument("--policy", action="append", help="a policy to run (repeatable); default: rate and copy")
    parser.add_argument("--verbose", action="store_true", help="also print the decisions not applied")
    args = parser.parse_args()
    steps = [float(s) for s in args.steps.split(",")]
    phase_s = args.phase_seconds or (12.0 if args.quick else 60.0)
    interval = "1s"
    r = run(args.cost_us, steps, phase_s, args.host_cpu, interval, args.policy)
    print(f"hot STATELESS operator, ~{args.cost_us:.0f} us/tuple = {r['rate'] / 1e3:.1f} k tuples per CPU second; "
          f"one lab host = {args.host_cpu:g} core = {r['unit'] / 1e3:.1f} k/s; lab hosts of "
          f"{r['budget'].get('cpu_per_host')} core; monitor interval {parse_timedelta(interval):g} s; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    report(r, args.verbose)


if __name__ == "__main__":
    main()

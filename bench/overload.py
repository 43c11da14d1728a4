"""Overload benchmark: 0.5x -> 3x -> 0.5x of the machine's capacity, default policies, random copies.

    python bench/overload.py [--quick] [--seconds S] [--seed N]

Pipeline (bench/benchops.py operators), three branches from one source:
``schedule`` (numbers every tuple, stamps its wall time, follows the rate
schedule) -> ``key_by`` -> ``keyed_sum`` (KEYED, keeping the stamp) -> ``keyed_check``;
the same ``key_by`` -> ``window`` (KEYED, per key and second of event
time) -> jsonl; ``window_count`` (MERGEABLE, tests/support_ops.py: copies hand
partial counts to the original) -> jsonl; and ``map`` (STATELESS) -> ``arrivals``.

1. Capacity: the same pipeline unthrottled, no policies, on the same
   embedded cluster size; capacity = tuples/s through the keyed sink over
   the second half of the run.
2. Run: the source offers 0.5x, 3x then 0.5x of that capacity, a third of
   ``--seconds`` each (default 300, --quick 60), with the default policies
   active; every few seconds an operator of each kind in turn (map, keyed
   sum, window, mergeable count; the order drawn with ``--seed``) gets a
   manual copy, which is released again at the next step.
3. Printed: tuples lost / duplicated on each branch (goal 0/0), stall events
   (goal 0), per-key order violations and wrong running sums (goal 0),
   window and per-second counts against a plain-Python count (goal equal:
   a count emitted twice or short is an error), p99 end-to-end
   latency per phase (age of a batch's oldest tuple at the keyed sink),
   and the workers' resident memory at the start and end of the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# window_count, the MERGEABLE operator the copy tests use (tests/support_ops.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import pescheduler  # noqa: E402
from pescheduler import Application, Release, Replicate  # noqa: E402

KEYS = 100
WINDOW_MS = 1000
PLUGINS = ["benchops", "support_ops"]
OPS = {"map": "STATELESS", "sum": "KEYED", "win": "KEYED", "count": "MERGEABLE"}


def build(name: str, tmp: str, phases: list) -> Application:
    app = Application(name)
    src = app.source("schedule", id="src", phases=phases, keys=KEYS)
    keyed = src.key_by("key", id="key")
    keyed.apply("keyed_sum", id="sum", keep=("sent",)).sink("keyed_check", id="check", path=os.path.join(tmp, "check.json"),
                                                 keys=KEYS)
    (keyed.window(size=WINDOW_MS, aggregates={"count": ("count", "n")}, id="win")
        .sink("jsonl", id="wsink", path=os.path.join(tmp, "windows.jsonl")))
    src.map(lambda t: {"n": t["n"]}, id="map").sink("arrivals", id="msink", path=os.path.join(tmp, "map.json"))
    src.apply("window_count", id="count", size=WINDOW_MS).sink("jsonl", id="csink",
                                                               path=os.path.join(tmp, "counts.jsonl"))
    return app


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else float("nan")


def emitted(status: dict) -> int:
    return next(o["tuples_out"] for o in status["operators"] if o["op"] == "src")


def capacity(seconds: float) -> float:
    """Tuples/s through the keyed branch, unthrottled, over the second half of the run."""
    with tempfile.TemporaryDirectory() as tmp:
        with pescheduler.deploy(build("overload-capacity", tmp, [(seconds, 1e9)]), plugins=PLUGINS,
                                policies=[]) as dep:
            dep.wait(timeout=seconds * 10 + 120)
        with open(os.path.join(tmp, "check.json")) as f:
            check = json.load(f)
    arrived = check["arrived"]
    half = arrived[0] + (arrived[-1] - arrived[0]) / 2
    late = [t for t in arrived if t >= half]
    # batches are about equal-sized at overload: the share of batches stands for the share of tuples
    return check["count"] * len(late) / len(arrived) / max(arrived[-1] - half, 1e-9)


def run(cap: float, seconds: float, every: float, seed: int) -> dict:
    third = seconds / 3
    phases = [(third, 0.5 * cap), (third, 3 * cap), (third, 0.5 * cap)]
    rng = random.Random(seed)
    actions, rss = [], []
    with tempfile.TemporaryDirectory() as tmp:
        dep = pescheduler.deploy(build("overload", tmp, phases), plugins=PLUGINS)
        try:
            t_start = time.time()
            next_action = time.monotonic() + every
            kinds = list(OPS)
            rng.shuffle(kinds)
            k = 0
            while dep.status()["state"] in ("running", "stalled"):
                try:
                    snap = dep.next_snapshot(timeout=5)
                    rss.append((time.time(), sum(w.memory_bytes for w in snap.workers.values())))
                except TimeoutError:
                    pass
                if time.monotonic() >= next_action and time.time() - t_start < seconds:
                    # Odd steps release the copy the step before made (the default policies
                    # may have released it first: then it is copied again).
                    op = kinds[k // 2 % len(kinds)]
                    copied = dep.placement().copies_of(op)
                    action = Release(op, 1) if copied and k % 2 else Replicate(op, 1)
                    k += 1
                    rec = dep.apply(action, timeout=60)
                    actions.append((round(time.time() - t_start, 1), repr(action), rec.applied,
                                    round(rec.pause_ms), rec.reason[:80], round(rec.steps.get("drain", 0))))
                    next_action = time.monotonic() + every
            status = dep.wait(timeout=seconds + 300)
        except BaseException:
            status = dep.stop()
            raise
        finally:
            dep.stop()
        with open(os.path.join(tmp, "check.json")) as f:
            check = json.load(f)
        with open(os.path.join(tmp, "map.json")) as f:
            mapped = json.load(f)
        with open(os.path.join(tmp, "windows.jsonl")) as f:
            windows = [json.loads(line) for line in f]
        with open(os.path.join(tmp, "counts.jsonl")) as f:
            counts = [json.loads(line) for line in f]
    return {"status": status, "check": check, "map": mapped, "windows": windows, "counts": counts, "rss": rss,
            "actions": actions, "phases": phases, "t_start": t_start}


def window_errors(windows: list[dict], n: int) -> int:
    """Windows whose count differs from a plain-Python count over numbers 0..n-1 (ts = n ms)."""
    want = Counter()
    for i in range(n):
        want[(i // WINDOW_MS * WINDOW_MS, i % KEYS)] += 1
    got = Counter()
    for w in windows:
        got[(w["window_start"], w["key"])] += w["count"]
    return sum(1 for k in set(want) | set(got) if want[k] != got[k])


def count_errors(counts: list[dict], n: int) -> int:
    """Per-second counts (MERGEABLE) that differ from a plain count, or were emitted twice."""
    got = Counter()
    twice = 0
    for c in counts:
        twice += c["window_start"] in got
        got[c["window_start"]] += c["count"]
    want = Counter(i // WINDOW_MS * WINDOW_MS for i in range(n))
    return twice + sum(1 for k in set(want) | set(got) if want[k] != got[k])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 1-minute smoke run")
    parser.add_argument("--seconds", type=float, default=None, help="length of the run (default 300, --quick 60)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    seconds = args.seconds or (60.0 if args.quick else 300.0)
    every = 2.5 if args.quick else 5.0
    t_begin = time.perf_counter()
    cap = capacity(8.0 if args.quick else 15.0)
    r = run(cap, seconds, every, args.seed)
    status, check, mapped = r["status"], r["check"], r["map"]
    n = emitted(status)
    print(f"overload: schedule -> key_by -> keyed_sum -> check | window | window_count | map -> sinks, default policies "
          f"({status['state']}); capacity {cap:,.0f} tuples/s measured unthrottled in this run")
    print("  offered: " + " -> ".join(f"{rate / cap:.1f}x ({rate:,.0f}/s) for {s:.0f} s" for s, rate in r["phases"]))
    lost_keyed = n - check["distinct"]
    lost_map = n - sum(e - s for s, e in mapped["runs"])
    print(f"  source emitted {n:,}; keyed branch: lost {lost_keyed}, duplicated {check['duplicates']}; "
          f"map branch: lost {lost_map}, duplicated {mapped['duplicates']}   (goal 0/0)")
    wrong_windows, wrong_counts = window_errors(r["windows"], n), count_errors(r["counts"], n)
    print(f"  per-key order violations {check['order']}, wrong running sums {check['bad_sums']}, "
          f"windows differing from a plain count {wrong_windows}, per-second counts (MERGEABLE) "
          f"wrong or twice {wrong_counts}   (goal 0)")
    stalls = [e for e in status["events"] if e["kind"] == "stalled"]
    print(f"  stall events {len(stalls)}   (goal 0)" + "".join(f"\n    {e['text']}" for e in stalls))
    t0, bounds, start = r["t_start"], [], 0.0
    for s, _rate in r["phases"]:
        bounds.append((start, start + s))
        start += s
    lat = list(zip(check["arrived"], check["latency"]))
    for i, (a, b) in enumerate(bounds):
        xs = [l for t, l in lat if a <= t - t0 < b]
        print(f"  phase {i + 1} ({r['phases'][i][1] / cap:.1f}x): p50 {pct(xs, 50) * 1000:8.1f} ms   "
              f"p99 {pct(xs, 99) * 1000:8.1f} ms end to end ({len(xs)} batches)")
    tail = [l for t, l in lat if t - t0 >= start]
    if tail:
        print(f"  after the schedule (drain): p99 {pct(tail, 99) * 1000:.1f} ms ({len(tail)} batches)")
    if r["rss"]:
        mb = [m / 2**20 for _t, m in r["rss"]]
        print(f"  workers' RSS: {mb[0]:.0f} MiB at start, {max(mb):.0f} MiB max, {mb[-1]:.0f} MiB at end "
              f"(growth {mb[-1] - mb[0]:+.0f} MiB)")
    applied = [a for a in r["actions"] if a[2]]
    print(f"  manual actions: {len(r['actions'])} ({len(applied)} applied); "
          f"policy reconfigurations: {sum(1 for e in status['events'] if e['kind'] == 'reconfigure') - len(applied)}")
    for a in r["actions"]:
        print(f"    t={a[0]:6.1f}s {a[1]:<28s} {'applied' if a[2] else 'refused'} pause {a[3]} ms "
              f"(drain {a[5]} ms) {a[4]}")
    print(f"total {time.perf_counter() - t_begin:.0f} s")
    ok = (lost_keyed == check["duplicates"] == lost_map == mapped["duplicates"] == check["order"]
          == check["bad_sums"] == len(stalls) == wrong_windows == wrong_counts == 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

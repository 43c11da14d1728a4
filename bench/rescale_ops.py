"""The live Replicate and Release pause of KEYED operators beside bench/state.py's ``latest``.

    python bench/rescale_ops.py [--keys 10000,100000,1000000] [--ops session,window,columnar,asof,count,count_whole]
                                [--backends memory,disk] [--quick]

bench/state.py's table rescales ``latest``, a single-input operator whose key groups move after
the pause (deferred: the pause is the marker alignment and the routing switch). This bench
rescales the others whose cost could differ, on a real 2-worker embedded deployment, one
deployment per (operator, backend, K) in a process of its own:

  session  ``every_key`` (each of K keys once, ``ts`` = the key) -> key_by -> a session window
           whose gap outlasts the stream, so every key holds an open session while the copy is
           added and released (single input: its groups move after the pause)
  window   the same into a tumbling time window wider than the stream (every key in one open
           pane; gated since session 46: its groups move after the pause)
  columnar the same, every batch an Arrow RecordBatch: the window's panes are numpy arrays
           (operators/columnar_window.py)
  asof     two ``every_key`` inputs -> key_by -> ``join_asof`` (backward): each key's last right
           event held (two inputs, gated per input since session 46: its groups move after the
           pause; docs/state-log.md, "Which operators are gated")
  count    the same into ``running_count``, an operator of your own as docs/state.md writes it
           (``pescheduler.state.KeyedOperator``: its keyed state named, its groups moved by the
           operator's own export and import)
  count_whole  the same operator written as that page showed it before (snapshot, restore,
           split_state, merge_states; no export_groups/import_groups): a rescale takes its
           whole state apart in its PE's turn (worker/handover.py)

Once every key is in the operator, one copy is added (``Replicate``) and released (``Release``);
then the sources end and the output is checked: each window gives one row per key, the
join one result per left event, each matched (exit 1 otherwise). Per row: the two pauses (the
reconfiguration's record), the longest import of a moving group in the gaining PE's turn (a stall of
its stream: the record's ``moving: longest import ms``, the larger of the two), whether its groups
moved after the pause (``deferred``: the record's
``moving: groups after the pause``; exit 1 if not: every KEYED operator's are since session 46)
and the load average. ``--quick``: K = 1,000 (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))     # benchops

WAIT_S = 900


def one(op: str, backend: str, k: int, root: str) -> dict:
    """One deployment: K keys into ``op`` on ``backend``, a copy added and released; its figures."""
    import pescheduler
    from pescheduler import Application, Release, Replicate

    os.environ["PESCHEDULER__STATE__DIR"] = root            # the forked workers' setting
    until, out = os.path.join(root, "until"), os.path.join(root, "out.jsonl")
    app = Application(f"rescale-{op}-{backend}-{k}")
    if op == "session":
        (app.source("every_key", keys=k, until=until).key_by("key")
            .window(gap=2 * k + 10, aggregates={"n": "count"}, id="op").sink("jsonl", path=out))
        expected_in = k
    elif op in ("window", "columnar"):
        (app.source("every_key", keys=k, until=until, arrow=op == "columnar").key_by("key")
            .window(size=2 * k + 10, aggregates={"n": "count"}, id="op").sink("jsonl", path=out))
        expected_in = k
    elif op in ("count", "count_whole"):
        (app.source("every_key", keys=k, until=until).key_by("key")
            .apply("running_count" if op == "count" else "running_count_whole", id="op").sink("jsonl", path=out))
        expected_in = k
    else:
        right = app.source("every_key", keys=k, until=until).key_by("key")
        left = app.source("every_key", keys=k, until=until).key_by("key")
        left.join_asof(right, by="key", id="op").sink("jsonl", path=out)
        expected_in = 2 * k
    with pescheduler.deploy(app, workers=2, plugins=["benchops"], policies=[], state=backend) as dep:
        deadline = time.monotonic() + WAIT_S
        while getattr(dep.snapshot().operators.get("op"), "tuples_in", 0) < expected_in:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{op}: {expected_in} tuples not in within {WAIT_S} s")
            time.sleep(0.1)             # polling the monitor's snapshot, bounded
        rep = dep.apply(Replicate("op", 1), timeout=WAIT_S)
        rel = dep.apply(Release("op", 1), timeout=WAIT_S)
        open(until, "w").close()
        status = dep.wait(timeout=WAIT_S)
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    if op in ("session", "window", "columnar"):
        exact = len(rows) == k and sum(r["n"] for r in rows) == k and {r["key"] for r in rows} == set(range(k))
    elif op in ("count", "count_whole"):
        exact = len(rows) == k and {r["key"] for r in rows} == set(range(k)) and {r["count"] for r in rows} == {1}
    else:
        exact = len(rows) == k and all(r["right"] is not None and r["right"]["key"] == r["left"]["key"] for r in rows)
    return {"op": op, "backend": backend, "k": k, "replicate_ms": rep.pause_ms, "release_ms": rel.pause_ms,
            "applied": rep.applied and rel.applied, "deferred": "moving: groups after the pause" in dict(rep.steps),
            "import_ms": max(dict(r.steps).get("moving: longest import ms", 0.0) for r in (rep, rel)),
            "state": status["state"], "rows": len(rows), "exact": exact, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="10000,100000,1000000", help="comma-separated K")
    parser.add_argument("--ops", default="session,window,asof")
    parser.add_argument("--backends", default="memory,disk")
    parser.add_argument("--quick", action="store_true", help="K = 1,000 only (a smoke test)")
    parser.add_argument("--one", nargs=4, metavar=("OP", "BACKEND", "K", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        op, backend, k, root = args.one
        print(json.dumps(one(op, backend, int(k), root)))
        return
    sizes = [1000] if args.quick else [int(x) for x in args.keys.split(",")]
    names = {"session": "session_window", "window": "window", "columnar": "window (arrow)", "asof": "join_asof",
             "count": "running_count", "count_whole": "count (whole)"}
    print(f"load average {os.getloadavg()[0]:.1f} (figures (L) on a loaded machine)")
    print(f"{'operator':15} {'backend':8} {'K':>9} {'Replicate ms':>13} {'Release ms':>11} {'import ms':>10}"
          f"  moves     output")
    failed = False
    for k in sizes:
        for op in args.ops.split(","):
            for backend in args.backends.split(","):
                with tempfile.TemporaryDirectory() as root:
                    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", op, backend, str(k), root],
                                          capture_output=True, text=True, timeout=3 * WAIT_S)
                if done.returncode:
                    print(f"{names[op]:15} {backend:8} {k:9d} failed:\n{done.stderr[-3000:]}")
                    failed = True
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                ok = r["applied"] and r["exact"] and r["state"] == "finished"
                failed |= not ok or not r["deferred"]      # every KEYED operator's groups move after the pause
                print(f"{names[op]:15} {backend:8} {k:9d} {r['replicate_ms']:13.1f} {r['release_ms']:11.1f} "
                      f"{r['import_ms']:10.1f}  "
                      f"{'deferred' if r['deferred'] else 'blocking':9} {'exact' if ok else 'NOT EXACT'} "
                      f"({r['rows']} rows, load {r['load']:.1f})", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

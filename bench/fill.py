"""The fill of bench/state.py's table in one process: ``latest`` on each backend against ``latest_in_dicts``
and, for ``disk``, against the raw client loop of its store.

    python bench/fill.py [--keys 1000000] [--backends dicts,memory,disk,rocksdb] [--interval 1] [--rounds 1]
                         [--profile pe|writer] [--batch 1000] [--quick] [--updates U]

What part 6's "x dicts" measures deployed, without the cluster: K inserts (``churn``'s fill:
``{"op": "insert", "id": i, "after": {"v": 1}}``) in batches into the operator, on this thread
(the "PE"), and every ``--interval`` seconds a checkpoint as a barrier takes it (the operator's
``snapshot``, ``pickle_snapshot``) with its files written by ``CheckpointFiles.write`` in a thread
of its own, as ``pe_ckpt_write`` runs it, beside the fill (one at a time: a barrier waits for the
last write to end, as the coordinator's one checkpoint in flight). ``dicts``: the plain dict
pickled whole at the barrier, in the PE's turn. ``rocksdb``: the strongest baseline of ``disk``,
the binding's own loop over the same batches into a store opened as ``disk`` opens it (its
options, its key encoding: a key's group byte, tag and digits), nothing else (bench/benchops.py's
``latest_in_rocksdb``, also the table's baseline in bench/state.py): each batch's keys grouped and
encoded, the rows pickled, sorted and put into one write batch, written, the outputs emitted as
``latest`` emits them; no reads of new keys, no checkpoints. What ``disk`` spends beyond it is the backend's; what ``rocksdb`` spends
is the floor a fill through this binding cannot go under. Each backend in a process of its own, ``--rounds``
times interleaved; the fill's rate (keys/s), the ratios to dicts and to rocksdb in the same round, the
checkpoints taken during the fill and the PE's time in barriers; keys per CPU second of the
process (every thread's, RocksDB's too: steadier than the wall clock on a loaded machine).

``--quick``: 20,000 keys, every backend (the smoke test's form).

``--updates U``: the steady stream instead of the fill. The K keys are filled before the clock
(and checkpointed once), then U updates of keys drawn at random among them (``{"op": "update",
...}``, made before the clock, the same draw in every backend's process) are timed in batches,
a checkpoint every ``--interval`` as in the fill; ``rocksdb`` reads each batch's keys in one
multi-get and unpickles them (``latest`` emits the row it replaces), then writes as in the fill.
The rate is updates/s.

``--profile pe``: cProfile of the fill's thread (the operator, the barriers); ``writer``: of the
writer threads; the top functions by own time, per backend. Figures on a loaded machine: ratios
within one round only.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time


def _benchops():
    """bench/benchops.py loaded by path (its LatestInDicts), not by putting bench/ on sys.path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchops", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                           "benchops.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one(backend: str, k: int, interval: float, batch: int, profile: str | None, updates: int = 0) -> dict:
    """One backend's fill (or, with ``updates``, its steady updates after the fill), in this process."""
    import dask.config

    from pescheduler.checkpoint import CheckpointStore
    from pescheduler.operator import Emitter, OperatorContext
    from pescheduler.operators import Latest
    from pescheduler.state.incremental import pickle_snapshot
    from pescheduler.worker.ckpt_files import CheckpointFiles

    root = tempfile.mkdtemp(prefix="fill-")
    dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": "512MB"})
    def made():
        if backend == "dicts":
            return _benchops().LatestInDicts()
        made = _benchops().LatestInRocksDB() if backend == "rocksdb" else Latest()
        made.open(OperatorContext(made.name, pe_id="pe", key_field="id", extra={"state": backend}))
        return made

    warm = made()                       # imports and first calls (numpy, rocksdict) before the clock
    warm.process([{"op": "insert", "id": -i, "after": {"v": 1}, "ts": 0} for i in range(1, batch + 1)], Emitter())
    if backend != "rocksdb":
        pickle_snapshot({"op": {"state": warm.snapshot()}})
    op = made()
    store, files = CheckpointStore(os.path.join(root, "ckpt"), b"k" * 32), CheckpointFiles()
    prof = {"pe": cProfile.Profile(), "writer": cProfile.Profile()}.get(profile) if profile else None
    writing: list[threading.Thread] = []
    barrier_s, cid = 0.0, 0

    def write(cid: int) -> None:
        if profile == "writer":
            prof.enable()
        try:
            written = files.write("bench", cid, ["pe"], store.url)["pe"]["files"]
            store.commit_manifest(cid, {"id": cid, "files": written})
            files.end("bench", cid, complete=True)
        finally:
            if profile == "writer":
                prof.disable()

    def barrier(cid: int) -> None:
        """The checkpoint's barrier in this thread: the operator's snapshot held for the writer."""
        blob, views = pickle_snapshot({"op": {"state": op.snapshot()}})
        files.hold("bench", cid, "pe", {"state": blob, "views": views, "positions": {}})

    # made before the clock: deployed they come from the source's PE (here they were half the time)
    batches = [[{"op": "insert", "id": i, "after": {"v": 1}, "ts": i} for i in range(s, min(k, s + batch))]
               for s in range(0, k, batch)]
    batches.reverse()
    if updates:                         # the fill before the clock, checkpointed once: the steady state
        while batches:
            op.process(batches.pop(), Emitter())
        if backend != "rocksdb":
            cid += 1
            barrier(cid)
            write(cid)
        draw = random.Random(1)
        batches = [[{"op": "update", "id": draw.randrange(k), "after": {"v": j}, "ts": j}
                    for j in range(s, min(updates, s + batch))] for s in range(0, updates, batch)]
        batches.reverse()
    before = cid                        # the steady state's checkpoint is not the clock's
    if profile == "pe":
        prof.enable()
    t0, c0 = time.perf_counter(), time.process_time()
    due = t0 + interval
    while batches:
        op.process(batches.pop(), Emitter())    # each batch let go once processed, as deployed
        now = time.perf_counter()
        if now >= due and backend != "rocksdb" and not (writing and writing[-1].is_alive()):
            cid += 1
            barrier(cid)
            writing.append(threading.Thread(target=write, args=(cid,), name="ckpt-writer", daemon=True))
            writing[-1].start()
            barrier_s += time.perf_counter() - now
            due = now + interval
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    if profile == "pe":
        prof.disable()
    for w in writing:
        w.join(600)
    held = op.held() if backend == "rocksdb" else len(op.rows) if backend == "dicts" else len(op.rows())
    done = updates or k
    out = {"backend": backend, "rate": done / took, "cpu_rate": done / cpu, "checkpoints": cid - before, "barrier_s": barrier_s,
           "load": os.getloadavg()[0], "held": held}
    if prof is not None:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        out["profile"] = text.getvalue()
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--backends", default="dicts,memory,disk,rocksdb")
    parser.add_argument("--quick", action="store_true", help="20,000 keys (the smoke test's form)")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", choices=("pe", "writer"))
    parser.add_argument("--switch", type=float, help="sys.setswitchinterval (s) in each backend's process")
    parser.add_argument("--updates", type=int, default=0,
                        help="time this many updates of random keys after the fill, not the fill")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.switch:
        sys.setswitchinterval(args.switch)
    if args.quick:
        args.keys = 20_000
    if args.one:
        print(json.dumps(one(args.one, args.keys, args.interval, args.batch, args.profile, args.updates)))
        return
    chosen = args.backends.split(",")
    what = (f"{args.updates:,} updates of random keys of {args.keys:,} held" if args.updates else
            f"fill of {args.keys:,} keys")
    unit = "updates/s" if args.updates else "keys/s"
    print(f"{what} into latest, batches of {args.batch}, a checkpoint every {args.interval:g} s "
          f"written in a thread; each backend in its own process")
    for r in range(args.rounds):
        rows = {}
        for b in chosen:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", b, "--keys", str(args.keys),
                   "--interval", str(args.interval), "--batch", str(args.batch), "--updates", str(args.updates)]
            if args.profile:
                cmd += ["--profile", args.profile]
            if args.switch:
                cmd += ["--switch", str(args.switch)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if done.returncode:
                print(done.stderr[-3000:])
                continue
            rows[b] = json.loads(done.stdout.strip().splitlines()[-1])
        base, floor = rows.get("dicts", {}).get("rate"), rows.get("rocksdb", {}).get("rate")
        for b, row in rows.items():
            x = f"{row['rate'] / base:.2f}" if base else "-"
            y = f"{row['rate'] / floor:.2f}" if floor else "-"
            print(f"round {r + 1} {b:7} {row['rate']:10,.0f} {unit}  x dicts {x:>5}  x rocksdb {y:>5}  "
                  f"{row['cpu_rate']:10,.0f} {unit[:-2]}/CPU s  "
                  f"checkpoints {row['checkpoints']}  "
                  f"barriers {1000 * row['barrier_s']:.0f} ms  load {row['load']:.1f}", flush=True)
            if "profile" in row:
                print(row["profile"])
        wrong = {b: row["held"] for b, row in rows.items() if row["held"] != args.keys}
        if wrong or len(rows) < len(chosen):
            print(f"round {r + 1}: keys held after the fill {wrong} (of {args.keys:,}), "
                  f"backends that failed {sorted(set(chosen) - set(rows))}")
            sys.exit(1)


if __name__ == "__main__":
    main()

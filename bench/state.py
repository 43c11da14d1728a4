"""Keyed state benchmark: the memory and disk backends against plain dicts, and what moves on a rescale.

    python bench/state.py [--keys 1000,10000,100000,1000000] [--huge] [--quick] [--parts 1,2,3,4,5,6]
                          [--backends memory,disk] [--checkpoints 10] [--timeout 2] [--hot 0]

For each K (``--huge`` adds 10^7; ``--quick``: 10^3 and 10^4, the live parts 3 and 6 at 10^3 only,
under a minute), one run, all figures from it.
Issue 30's table alone, both backends: ``--parts 6 --keys 1000,10000,100000,1000000 [--huge]``;
from 10^7 keys the table's checkpoint interval stretches (1 % of the keys per second would be more
changes than :data:`CHANGES_PER_S`), each checkpoint still following 1 % of the keys changed.

  1. Backends (pescheduler/state/), each (backend, K) in a fresh process so its RSS is its own;
     values are a window's slots (``[count, sum, min, max]``, keys ``car-0000042``):
       load, read      K puts (the fill), K gets in random order (best of 3): per second, and as
                       a ratio to plain dicts
       snapshot        the stall of ``snapshot()`` (memory: copy-on-write, O(key groups);
                       disk: a RocksDB checkpoint, O(files))
       full            bytes and time of exporting every key group from the view
       1 % changed     key groups written after K/100 random puts, and their bytes: what an
                       incremental checkpoint by key group would write
       move half       export of half the key groups and import into a new store (a Replicate)
       RSS             the process's resident memory after the load, less before it
  2. The time window's snapshot, split and restore at K keys (operators/window.py, in-process):
     today's per-key-group snapshot against the previous one (copy of every pane, then pickle),
     a split by key group against the previous split by key, a restore (unpickle, keys back in
     first-seen order) against the previous one (unpickle, copy of every pane). The first
     snapshot also computes every key's group (later ones remember them).
  3. Live: a count window holding K keys on a 2-worker embedded cluster,
     per backend: Replicate and Release pause (``ApplyRecord.pause_ms``), then a Move of the
     window's PE, all its key groups, to the other worker, and its pause; how long after each
     pause the moving key groups were all in (``moving: done ms after the pause``), the last checkpoint's
     duration, bytes written and bytes referenced, the largest worker RSS and this (deploying)
     process's RSS. ``--hot H``: after the fill the source goes on at :data:`HOT_RATE` tuples a
     second, 90 % of them over H keys, and each move's tuples held for their groups and their
     mean wait are printed (a move sends the groups tuples wait for first).
  4. Checkpoints of keyed state (in-process, one (backend, K) per process): the PE's stall at the
     barrier (its synchronous part: before, the key groups packed and pickled there; now, a view
     set aside), the worker's write of a full checkpoint and of one after 1 % of the keys changed
     (time, bytes, their ratio), and a restore: the deploying process's part (time, RSS growth:
     it holds references, not state) and the worker's (read, check, apply deltas, import).
  5. The time window on both backends (operators/window.py, in-process, one (backend, K) per
     process): K keys, four panes of one tuple per key, sliding windows of two panes firing at
     each pane's end: tuples per second (and the ratio to memory), the RSS growth while two panes
     are held, and where the panes are (entries in the window's dicts, keys in the store).
     ``disk``: the default write buffer (a small state stays in it); ``spill``: disk with a buffer
     of 1,000 (key, pane) entries, so the panes live in the store (one tuple per key and pane:
     the worst case, every tuple a store read and write).
  6. Issue 30's table, one deployment per (backend, K) in a process of its own (its RSS is the
     deploying process's): ``churn`` fills K keys into ``latest`` (KEYED, its rows in the backend,
     about 180 bytes of Python per key), then changes 1 % of the keys per second (the checkpoint
     interval) beside 500 ticks per second of one more key, each an output; ``stamps`` notes when
     outputs arrive; once a checkpoint begun after the fill is complete, a Replicate and a Release of
     ``latest``. Per row: Replicate and Release pause; the PE's stall at a checkpoint (the
     largest gap between outputs overlapping a checkpoint, with the median gap beside it, and under
     the row the largest gap of each second outside checkpoints: the stream's own);
     checkpoint duration, bytes written and state referenced (the largest ratio of ``--checkpoints``
     (10) in the steady stream; the one right after the Release, which writes the moved key groups
     whole, is shown apart with every checkpoint's share of whole groups and deltas); a SIGKILL of ``latest``'s worker to the first output after the restore; the
     largest worker RSS and the deploying process's; the fill's rate against ``dicts``, the same
     pipeline with ``latest_in_dicts`` (rows in one plain dict, snapshot a copy at the barrier),
     and, under each backend's row, against ``rocksdb``: the same pipeline with ``latest_in_rocksdb``,
     the binding's raw loop into a store opened as ``disk`` opens it (bench/benchops.py; no reads of
     new keys, nothing kept for a checkpoint, its rows not checkpointed), the least a fill through
     this binding costs here;
     under the row, the checkpoint attempts aborted (``pescheduler.checkpoint.timeout``) by the end
     of the fill's checkpoint, of the moves and of the steady part, and each worker's CPU in the
     steady part (its event loop's, with the time it waited on a runqueue for a core; its other
     Python threads'; RocksDB's threads'), which the stall reads against on a machine of two cores,
     and when a PE went to a thread of its own (a turn over 100 ms) and came back to its loop.
     The workers' ``pescheduler.state.cache`` is 512 MB. Each row says which of issue 30's goals
     it met. ``--quick``: K = 10^3 only.
  7. (only with ``--parts 7``) A first checkpoint longer than ``pescheduler.checkpoint.timeout``
     (``--timeout``, 2 s): the table's pipeline filling K keys, checkpoints every second; per
     checkpoint id the keys when its directory appeared, the bytes of key-group files in the
     storage and in the workers' copies of what they wrote (polled) and whether it completed.
     Since the timeout bounds a write without progress (session 62), a write longer than it
     completes at its first attempt; an attempt is aborted only where the snapshots take longer.
     ``--parts 7 --keys 1000000 --backends disk --timeout 4``.

Figures on a loaded machine are only comparable as ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VALUE = [12, 345.5, 1.25, 99.75]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def keys_of(k: int) -> list[str]:
    return [f"car-{i:07d}" for i in range(k)]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# -- 1. backends, one (backend, K) per process --------------------------------------------------

def one_backend(backend: str, k: int, root: str) -> dict:
    """Every figure of part 1 for one backend and K (run in a child process)."""
    import dask.config

    from pescheduler.state import open_state

    keys, rng = keys_of(k), random.Random(7)
    order = keys[:]
    rng.shuffle(order)
    before = rss_bytes()
    if backend == "dict":
        d: dict = {}
        load = timed(lambda: [d.__setitem__(key, list(VALUE)) for key in keys])
        read = min(timed(lambda: [d.get(key) for key in order]) for _ in range(3))
        return {"load": k / load, "read": k / read, "rss": rss_bytes() - before}
    with dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": "256MB"}):
        st = open_state(backend, owner=f"bench-{k}")
    load = timed(lambda: [st.put(key, list(VALUE)) for key in keys])
    read = min(timed(lambda: [st.get(key) for key in order]) for _ in range(3))
    rss = rss_bytes() - before
    t0 = time.perf_counter()
    view = st.snapshot()
    stall = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = view.export()
    full_s = time.perf_counter() - t0
    view.release()
    for key in order[: max(1, k // 100)]:
        st.put(key, [13, 0.0, 0.0, 0.0])
    changed = st.changed()
    changed_bytes = sum(len(b) for b in st.export_groups(changed).values())
    half = st.groups()[::2]
    t0 = time.perf_counter()
    with dask.config.set({"pescheduler.state.dir": root}):
        other = open_state(backend, owner="other")
    other.import_groups(st.export_groups(half))
    move = time.perf_counter() - t0
    other.close()
    st.close()
    return {"load": k / load, "read": k / read, "rss": rss, "snapshot_ms": stall * 1000,
            "full_bytes": sum(map(len, full.values())), "full_ms": full_s * 1000,
            "changed_groups": len(changed), "changed_bytes": changed_bytes, "move_ms": move * 1000}


def backends(sizes: list[int]) -> None:
    print("1. backends: per second, ratio to plain dicts; snapshot stall; bytes (one process each)")
    print(f"{'K':>9} {'backend':8} {'load/s':>10} {'x dict':>7} {'read/s':>10} {'x dict':>7} "
          f"{'snap ms':>8} {'full MB':>8} {'full ms':>8} {'1% grp':>6} {'1% MB':>7} {'move ms':>8} {'RSS MB':>7}")
    with tempfile.TemporaryDirectory() as root:
        for k in sizes:
            rows = {b: child(b, k, root) for b in ("dict", "memory", "disk")}
            base = rows["dict"]
            for b, r in rows.items():
                extra = "" if b == "dict" else (
                    f"{r['snapshot_ms']:8.1f} {r['full_bytes'] / 1e6:8.2f} {r['full_ms']:8.0f} "
                    f"{r['changed_groups']:6d} {r['changed_bytes'] / 1e6:7.2f} {r['move_ms']:8.0f}")
                print(f"{k:9d} {b:8} {r['load']:10.0f} {r['load'] / base['load']:7.2f} {r['read']:10.0f} "
                      f"{r['read'] / base['read']:7.2f} {extra or ' ' * 54:54} {r['rss'] / 2**20:7.1f}")


def child(backend: str, k: int, root: str) -> dict:
    return child_of("--one", backend, k, root)


def child_of(part: str, backend: str, k: int, root: str) -> dict:
    """A part's figures for one (backend, K), measured in a fresh process."""
    out = subprocess.run([sys.executable, __file__, part, backend, str(k), root],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"{part} {backend} {k} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- 2. the time window's snapshot ----------------------------------------------------------------

def window_state(sizes: list[int]) -> None:
    from pescheduler.operator import Emitter, OperatorContext
    from pescheduler.operators.window import Window
    from pescheduler.wire import key_group

    print("\n2. time window (memory): snapshot+pickle, split, restore; previous way in the same run")
    print(f"{'K':>9} {'1st snap':>9} {'snapshot':>9} {'previous':>9} {'split ms':>9} {'previous':>9} {'restore ms':>11} "
          f"{'previous':>9}")
    for k in sizes:
        w = Window(60_000, aggregates={"n": ("count", "v"), "s": ("sum", "v")})
        w.open(OperatorContext("w", key_field="key"))
        keys = keys_of(k)
        w.process([{"key": key, "v": 1.0, "ts": 1} for key in keys], Emitter())
        t_first = timed(lambda: pickle.dumps(w.snapshot(), 5))       # every key's group computed
        t0 = time.perf_counter()
        snap = pickle.dumps(w.snapshot(), 5)                          # remembered from the first
        t_snap = time.perf_counter() - t0
        whole = {p: dict(w._layers.items(w._panes, p)) for p in w._panes}     # its panes, layers merged
        t0 = time.perf_counter()
        prev = pickle.dumps({p: {key: list(s) for key, s in d.items()} for p, d in whole.items()}, 5)
        t_prev = time.perf_counter() - t0
        mine = frozenset(range(0, 128, 2))
        owns = lambda key: key_group(key) in mine        # what a rescale passes (plan/state.py)
        state = pickle.loads(snap)
        t_split = timed(lambda: w.split_state(state, owns))
        panes = pickle.loads(prev)
        t_prev_split = timed(lambda: {p: {key: s for key, s in d.items() if owns(key)} for p, d in panes.items()})
        fresh = Window(60_000, aggregates={"n": ("count", "v"), "s": ("sum", "v")})
        t_restore = timed(lambda: fresh.restore(pickle.loads(snap)))
        t_prev_restore = timed(lambda: {p: {key: list(s) for key, s in d.items()} for p, d in pickle.loads(prev).items()})
        assert sum(map(len, fresh._panes.values())) == k
        print(f"{k:9d} {t_first * 1000:9.1f} {t_snap * 1000:9.1f} {t_prev * 1000:9.1f} {t_split * 1000:9.2f} "
              f"{t_prev_split * 1000:9.1f} {t_restore * 1000:11.1f} {t_prev_restore * 1000:9.1f}")


# -- 3. live: a count window of K keys, copied and released ---------------------------------------

HOT_RATE = 2000         # part 3's --hot: tuples a second after the fill

def live(sizes: list[int], backends_: list[str], hot: int = 0) -> None:
    import pescheduler
    from pescheduler import Application, Move, Release, Replicate

    print("\n3. live: count window of K keys on 2 workers; checkpoints every 1 s; a Replicate, a Release, "
          "then a Move of its PE (every key group) to the other worker" +
          (f"; after the fill {HOT_RATE} tuples/s, 90 % of them over {hot} keys: each move's tuples held and their "
           "mean wait for their group (held/wait)" if hot else ""))
    print(f"{'K':>9} {'backend':8} {'Replicate ms':>13} {'Release ms':>11} {'Move ms':>8} {'moved after':>15} {'ckpt s':>7} "
          f"{'ckpt MB':>8} {'state MB':>9} {'worker RSS MB':>14} {'deployer RSS MB':>16}" +
          (f" {'held/wait ms: Replicate, Release, Move':>40}" if hot else ""))
    for k in sizes:
        for backend in backends_:
            with tempfile.TemporaryDirectory() as tmp:
                until = os.path.join(tmp, "done")
                app = Application(f"state-{backend}-{k}")
                stream = {"then": HOT_RATE, "hot": hot} if hot else {}
                (app.source("every_key", keys=k, until=until, **stream).key_by("key")
                    .window(count=2**30, aggregates={"n": ("count", "v")}).sink("discard"))
                with pescheduler.deploy(app, workers=2, plugins=["benchops"], policies=[], state=backend,
                                        checkpoint=os.path.join(tmp, "ckpt"), checkpoint_interval="1s") as dep:
                    op = next(x for x in dep.placement().plan.ops if x.startswith("count_window"))
                    snap = wait_for(dep, lambda s: op in s.operators and s.operators[op].tuples_in >= k)
                    rep, rel = dep.apply(Replicate(op, 1)), dep.apply(Release(op, 1))
                    assert rep.applied and rel.applied, (rep.reason, rel.reason)
                    placement = dep.placement()
                    pe = placement.pe_of(op)
                    there = next(w for w in placement.workers if w != placement.pes[pe].worker)
                    mv = dep.apply(Move(pe, there), timeout=600)
                    assert mv.applied, mv.reason
                    seen = dep.checkpoints()[-1]["id"] if dep.checkpoints() else 0     # (the list is bounded)
                    wait_for(dep, lambda s: dep.checkpoints() and dep.checkpoints()[-1]["id"] >= seen + 3)
                    last = dep.checkpoints()[-1]
                    worker_rss = max(w.memory_bytes for w in dep.snapshot().workers.values())
                    open(until, "w").close()
                    dep.wait(timeout=600)
                waits = ", ".join(f"{r.steps.get('moving: tuples held', 0)}/"
                                  f"{r.steps.get('moving: mean wait of a tuple held ms', 0):.0f}"
                                  for r in (rep, rel, mv))
                print(f"{k:9d} {backend:8} {rep.pause_ms:13.1f} {rel.pause_ms:11.1f} {mv.pause_ms:8.1f} {moved(rep, rel, mv):>15} "
                      f"{last['duration_s']:7.2f} "
                      f"{last['bytes'] / 1e6:8.2f} {last['state_bytes'] / 1e6:9.2f} {worker_rss / 2**20:14.0f} "
                      f"{rss_bytes() / 2**20:16.0f}" + (f" {waits:>40}" if hot else ""))
                del snap


def moved(*records) -> str:
    """Milliseconds after each pause until the moving key groups were all in (the rescale's
    end; "-": they moved inside the pause)."""
    done = [r.steps.get("moving: done ms after the pause") for r in records]
    return "/".join("-" if d is None else f"{d:.0f}" for d in done)


# -- 4. checkpoints of keyed state: the barrier, the worker's writes, the restore -------------------

def one_checkpoint(backend: str, k: int, root: str) -> dict:
    """Part 4 for one backend and K (run in a child process, so its RSS is its own)."""
    import cloudpickle
    import dask.config

    from pescheduler.checkpoint import CheckpointStore
    from pescheduler.state import open_state
    from pescheduler.state.groups import restore_groups, snapshot_groups
    from pescheduler.worker.ckpt_files import CheckpointFiles

    dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": "256MB"})   # this process's
    st = open_state(backend, owner=f"ckpt-{k}")
    keys = keys_of(k)
    for key in keys:
        st.put(key, list(VALUE))
    before = timed(lambda: cloudpickle.dumps({"op": {"groups": dict(snapshot_groups(st))}}))
    store = CheckpointStore(os.path.join(root, f"ckpt-{backend}-{k}"), b"k" * 32)
    files, out = CheckpointFiles(), {}
    for cid in (1, 2):
        if cid == 2:
            for key in random.Random(cid).sample(keys, max(1, k // 100)):      # 1 % of the keys
                st.put(key, [13, 0.0, 0.0, 0.0])
        out[cid] = checkpoint_once(store, files, st, cid)
    restored = open_state("memory")
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    saved = deploying_side(store, 2)
    deploying_s, deploying_rss = time.perf_counter() - t0, rss_bytes() - rss0
    from pescheduler.state.incremental import resolve_restore

    worker_s = timed(lambda: (resolve_restore(saved), restore_groups(restored, saved["op"]["state"]["groups"])))
    assert len(restored) == k                       # read from the storage, as a worker that lost its disk
    from pescheduler.state.local import LocalCopies
    from pescheduler.state.settings import deployment_dir

    again, copies = deploying_side(store, 2), LocalCopies(deployment_dir("bench"))
    local_s = timed(lambda: (resolve_restore(again, copies), restore_groups(restored, again["op"]["state"]["groups"])))
    st.close()
    return {"barrier_before_ms": before * 1000, "barrier_ms": out[1]["barrier_s"] * 1000,
            "full_s": out[1]["write_s"], "full_bytes": out[1]["bytes"], "inc_s": out[2]["write_s"],
            "inc_bytes": out[2]["bytes"], "state_bytes": out[2]["state_bytes"], "deploying_s": deploying_s,
            "deploying_rss": deploying_rss, "worker_s": worker_s, "local_s": local_s}


def checkpoint_once(store, files, st, cid: int) -> dict:
    """One checkpoint as a PE and its worker take it: the barrier's part, then the worker's write."""
    from pescheduler.state.groups import snapshot_groups
    from pescheduler.state.incremental import pickle_snapshot

    t0 = time.perf_counter()
    blob, views = pickle_snapshot({"op": {"state": {"groups": snapshot_groups(st)}, "progress": None,
                                          "driver": None}})
    barrier = time.perf_counter() - t0
    files.hold("bench", cid, "pe", {"state": blob, "views": views, "positions": {}})
    t0 = time.perf_counter()
    written = files.write("bench", cid, ["pe"], store.url)["pe"]["files"]
    write = time.perf_counter() - t0
    store.commit_manifest(cid, {"id": cid, "files": written})
    files.end("bench", cid, complete=True)
    return {"barrier_s": barrier, "write_s": write, "bytes": sum(f["bytes"] for f in written if f["chk"] == cid),
            "state_bytes": sum(f["bytes"] for f in written)}


def deploying_side(store, cid: int) -> dict:
    """What the deploying process does to restore checkpoint ``cid`` (checkpoint/restore.py's _load
    without the placement mapping): the manifest, the .state file, every key-group file hashed."""
    from pescheduler.state.incremental import load_snapshot, load_state_file, with_entries

    manifest = store.manifest(cid)
    groups = [e for e in manifest["files"] if e["role"] == "group"]
    for entry in groups:
        store.files.check(entry, store.run)
    state = next(e for e in manifest["files"] if e["role"] == "state")
    blob = load_state_file(store.read(state, store.run))
    ops = load_snapshot(blob["ops"], with_entries(blob["groups"], manifest["files"], lambda e: store.read(e, store.run)))
    return {"op": {**ops["op"], "storage": store.storage}}


def checkpoints(sizes: list[int], backends_: list[str]) -> None:
    print("\n4. checkpoints of keyed state, one process per (backend, K)")
    print("   barrier ms: the PE's synchronous part (before: packed and pickled there; now: a view set aside)")
    print("   full / 1%: the worker's write of the first checkpoint / of one after 1 % of keys changed")
    print("   restore: the deploying process's part (s, RSS growth) and the worker's read and import, from the")
    print("   storage and from its own copies (local recovery)")
    print(f"{'K':>9} {'backend':8} {'barrier before':>15} {'barrier now':>12} {'full s':>7} {'full MB':>8} "
          f"{'1% s':>6} {'1% MB':>7} {'1%/full':>8} {'deployer s':>11} {'deployer RSS MB':>16} {'worker s':>9} "
          f"{'local s':>8}")
    with tempfile.TemporaryDirectory() as root:
        for k in sizes:
            for backend in backends_:
                r = child_of("--checkpoint", backend, k, root)
                print(f"{k:9d} {backend:8} {r['barrier_before_ms']:15.1f} {r['barrier_ms']:12.2f} {r['full_s']:7.2f} "
                      f"{r['full_bytes'] / 1e6:8.2f} {r['inc_s']:6.2f} {r['inc_bytes'] / 1e6:7.3f} "
                      f"{r['inc_bytes'] / r['full_bytes']:8.3f} {r['deploying_s']:11.2f} "
                      f"{r['deploying_rss'] / 2**20:16.1f} {r['worker_s']:9.2f} {r['local_s']:8.2f}")


def wait_for(dep, predicate, timeout: float = 900):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = dep.next_snapshot(timeout=timeout)
        if predicate(snap):
            return snap
    raise TimeoutError("the deployment did not get there")


# -- 5. the time window on both backends ------------------------------------------------------------

def one_window(backend: str, k: int, root: str) -> dict:
    """Part 5's figures for one (backend, K) (run in a child process)."""
    import dask

    from pescheduler.operator import Emitter, OperatorContext
    from pescheduler.operators.window import Window

    with dask.config.set({"pescheduler.state.dir": root}):
        w = Window(2000, 1000, aggregates={"n": ("count", "v"), "s": ("sum", "v")})
        if backend == "spill":                    # disk with a write buffer smaller than the state
            backend, w.buffer_entries = "disk", 1000
        w.open(OperatorContext("w", pe_id="bench", key_field="key", extra={"state": backend}))
        keys, out, rss0, rss_held = keys_of(k), Emitter(), rss_bytes(), 0
        rounds = [[{"key": key, "v": 1.0, "ts": 1000 * r + i % 1000} for i, key in enumerate(keys)]
                  for r in range(4)]
        t0 = time.perf_counter()
        for r, batch in enumerate(rounds):
            for b in range(0, k, 1000):
                w.process(batch[b:b + 1000], out)
            if r == 1:
                rss_held = rss_bytes() - rss0
                in_dicts = sum(map(len, w._panes.values()))
                in_store = 0 if w._store is None else len(w._store)
            w.on_watermark(1000 * r + 999, out)
        elapsed = time.perf_counter() - t0
    assert len(out) == 4 * k, len(out)            # windows ending at 1000, 2000, 3000, 4000
    return {"rate": 4 * k / elapsed, "rss": rss_held, "in_dicts": in_dicts, "in_store": in_store}


def windows(sizes: list[int]) -> None:
    print("\n5. time window on both backends: tuples/s, ratio to memory, RSS growth with two panes held (one process each)")
    print(f"{'K':>9} {'backend':13} {'tuples/s':>10} {'x memory':>9} {'RSS MB':>7} {'in dicts':>9} {'in store':>9}")
    with tempfile.TemporaryDirectory() as root:
        for k in sizes:
            rows = {b: child_of("--window", b, k, root) for b in ("memory", "disk", "spill")}
            for b, r in rows.items():                 # labelled apart from parts 1, 3 and 4's rows
                print(f"{k:9d} {'window-' + b:13} {r['rate']:10.0f} {r['rate'] / rows['memory']['rate']:9.2f} "
                      f"{r['rss'] / 2**20:7.1f} {r['in_dicts']:9d} {r['in_store']:9d}")


# -- 6. issue 30's table: one live deployment per (backend, K), every column from it ----------------

# the table's rows besides the backends', by their operator (each keeps its rows itself: latest_in_rocksdb in a
# disk store of its own, whatever the deployment's backend)
BASELINES = {"dicts": "latest_in_dicts", "rocksdb": "latest_in_rocksdb"}
CHANGES_PER_S = 20_000     # the most changed keys per second the table asks (more than this pipeline keeps up with
                           # on this machine at 10^7: 1 % per second is 100,000/s); beyond it the checkpoint
                           # interval stretches so that each still follows 1 % of the keys changed
CHECKPOINTS = int(os.environ.get("STATE_BENCH_CHECKPOINTS", "10"))   # steady checkpoints per row (--checkpoints)
CACHE = "512MB"            # pescheduler.state.cache of the workers (issue 30: 10 M keys with 512 MB)
ABOUT_1_PCT = 0.015        # a checkpoint the 1 % column reads followed at most this share of the keys changed
OUTSIDE_THE_PAUSE = ("moving:", "open")   # record entries that are not the pause's steps: the moves' figures
                                           # after it (bytes, tuples held, a timestamp) and a copy's opening before it
GOALS = "pause <= 100 ms, stall <= 20 ms, 1 % checkpoint <= 5 % of the state, first output <= 5 s " \
        "after SIGKILL, disk >= 0.5x memory at 1 M"


def one_table_row(backend: str, k: int, root: str) -> dict:
    """One row of the table (run in a child process: the deploying process's RSS is this one's).

    ``churn`` fills K keys into ``latest`` (keyed, its rows in the backend; the :data:`BASELINES`:
    ``dicts``, the same pipeline with ``latest_in_dicts``, rows in one plain dict; ``rocksdb``, with
    ``latest_in_rocksdb``, the binding's raw loop; neither is rescaled nor killed), then changes 1 % of the keys per
    second (the checkpoint interval) and 500 ticks per second, each an output of ``latest``: the
    gaps between outputs at the ``stamps`` sink are the operator's stalls. A Replicate and a
    Release of ``latest``; three checkpoints; then its worker is SIGKILLed and the time to the first
    output after the restore is taken from the kill."""
    import signal

    import dask.config

    import pescheduler
    from pescheduler import Application, Release, Replicate

    os.environ["PESCHEDULER__STATE__CACHE"] = CACHE       # the workers' settings, read where they open a store
    os.environ["PESCHEDULER__STATE__DIR"] = root          # (a killed worker's files go with the run's directory)
    until, stamps = os.path.join(root, f"done-{backend}-{k}"), os.path.join(root, f"stamps-{backend}-{k}")
    app = Application(f"table-{backend}-{k}")
    interval = interval_for(k)
    (app.source("churn", keys=k, until=until, changes=max(1, k // 100) / interval, start=stamps + ".start").key_by("id")
        .apply(BASELINES.get(backend, "latest"), id="state").sink("stamps", path=stamps))
    row: dict = {"backend": backend, "k": k}
    with dask.config.set({"pescheduler.checkpoint.retain": 4 * CHECKPOINTS}), pescheduler.deploy(app, workers=2, plugins=["benchops"], policies=[],
                            state="memory" if backend in BASELINES else backend,
                            checkpoint=os.path.join(root, f"ckpt-{backend}-{k}"),
                            checkpoint_interval=f"{interval}s") as dep:
        wait_for(dep, lambda s: "state" in s.operators and s.operators["state"].tuples_in >= k)
        # A checkpoint begun after the fill completes before the moves, so the first one after the
        # Release writes the moved groups whole and the deltas, not most of the state as well: with
        # none complete since a checkpoint taken during the fill, that one wrote the whole state
        # beside the moves and at 10^7 passed the 30 s timeout (aborted; the next attempt built on
        # its files, docs/checkpoints.md "Attempts"), in one row in nine (session 59)
        filled = time.time()
        wait_for(dep, lambda s: any(c["time"] >= filled for c in dep.checkpoints()))
        row["aborted"] = {"fill": dep.status()["checkpoints"]["aborted"]}   # attempts aborted, counted by the end of each part
        if backend not in BASELINES:
            moves_from = time.time()
            rep, rel = dep.apply(Replicate("state", 1), timeout=600), dep.apply(Release("state", 1), timeout=600)
            assert rep.applied and rel.applied, (rep.reason, rel.reason)
            row.update(replicate_ms=rep.pause_ms, release_ms=rel.pause_ms, moves=(moves_from, time.time()),
                       replicate_steps=dict(rep.steps), release_steps=dict(rel.steps))   # where each pause went
        row["aborted"]["moves"] = dep.status()["checkpoints"]["aborted"]
        steady = time.time()
        pids = {w: info["pid"] for w, info in dep.worker_info.items()}
        cpu_from = thread_cpu(pids.values())
        seen = dep.checkpoints()[-1]["id"] if dep.checkpoints() else 0     # by id: the list keeps the newest 30
        wait_for(dep, lambda s: len([c for c in dep.checkpoints() if c["id"] > seen and c["time"] >= steady])
                 >= CHECKPOINTS + 1)
        every = dep.checkpoints()
        picked = [i for i, c in enumerate(every) if c["id"] > seen and c["time"] >= steady]
        kinds = {i: written_by_kind(every[i]) for i in {*picked, *(i - 1 for i in picked if i)}}   # each manifest read once
        row["checkpoints"] = [{**every[i], **kinds[i], "changed": changed_share(kinds, i, k)} for i in picked]
        row["worker_rss"] = max(w.memory_bytes for w in dep.snapshot().workers.values())
        row["deployer_rss"] = rss_bytes()
        row["aborted"]["steady"] = dep.status()["checkpoints"]["aborted"]
        placement = dep.placement()
        state_worker = placement.pes[placement.pe_of("state")].worker
        row["cpu"] = cpu_shares(cpu_from, thread_cpu(pids.values()), time.time() - steady, pids.get(state_worker))
        # the PEs' moves to a thread of their own and back, by the kill (a PE threaded in the steady part
        # shares the GIL with its loop: docs/state-log.md, session 66)
        row["threaded"] = [e for e in dep.status().get("events", ()) if e["kind"] == "thread"]
        row["killed_at"] = time.time()
        around = dep.checkpoints()          # every one begun before the kill: the stream's own gaps are outside them
        if backend not in BASELINES:
            os.kill(dep.worker_info[state_worker]["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not any(
                    "first_output_s" in r or "error" in r for r in dep.recovery.restarts):
                time.sleep(0.1)                 # polling the recovery's record, bounded
            restart = dep.recovery.restarts[0] if dep.recovery.restarts else {}
            if "first_output_s" in restart:
                row["first_output_s"] = restart["at"] - row["killed_at"] + restart["first_output_s"]
        open(until, "w").close()
        dep.wait(timeout=900)
    row.update(stalls(stamps, k, steady, row["killed_at"], row["checkpoints"], row.get("moves"), around))
    return row


def thread_cpu(pids) -> dict:
    """Each thread's CPU so far, ``{(pid, tid): (kind, run s, runqueue wait s)}``, from
    ``/proc/<pid>/task/<tid>/schedstat``: ``kind`` the worker's ``loop`` (its main thread: the
    event loop, and a PE's turns until a long turn gives it a thread, ``worker/turns.py``),
    ``rocksdb`` (RocksDB's flushes and compactions, named so by RocksDB) or ``python`` (any other:
    a PE's own thread, the checkpoint's writer, the pools)."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    run, wait = f.read().split()[:2]
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    comm = f.read().strip()
            except (OSError, ValueError):
                continue
            kind = "loop" if int(tid) == pid else "rocksdb" if comm.startswith("rocksdb") else "python"
            out[(pid, int(tid))] = (kind, int(run) / 1e9, int(wait) / 1e9)
    return out


def cpu_shares(before: dict, after: dict, wall: float, state_pid: int | None) -> dict:
    """Per worker (``state``: the one running ``latest``; ``other``: the source's), the share of
    ``wall`` each kind of thread (:func:`thread_cpu`) ran and, for the loop, waited on a runqueue for a
    CPU: the stall at a checkpoint reads against them (2 cores here: a loop waiting for a CPU is
    the machine saturated, not a GIL held; docs/state-log.md, session 65)."""
    out: dict = {}
    for (pid, tid), (kind, run, wait) in after.items():
        run0, wait0 = before.get((pid, tid), (kind, 0.0, 0.0))[1:]
        who = out.setdefault("state" if pid == state_pid else "other", {})
        who[f"{kind}_run"] = who.get(f"{kind}_run", 0.0) + (run - run0) / wall
        if kind == "loop":
            who["loop_wait"] = (wait - wait0) / wall
    return out


def interval_for(k: int) -> float:
    """The checkpoint interval of the table's row at K (s): 1 s (``--quick``: 0.5 s), stretched where
    1 % of the keys per interval would be more than :data:`CHANGES_PER_S`, so each checkpoint still
    follows 1 % of the keys changed."""
    return max(float(os.environ.get("STATE_BENCH_INTERVAL", "1")), (k // 100) / CHANGES_PER_S)


def written_by_kind(c: dict) -> dict:
    """What checkpoint ``c`` wrote, from its manifest (kept: the table retains every checkpoint it
    reads): bytes of whole key groups, of deltas and of the PEs' ``.state`` files, and how many
    group files of each kind; and the manifest's own bytes, counted in ``bytes`` (it is written by
    this checkpoint: before manifests referred to their predecessor, ``bytes`` left it out, and a
    whole list of every file was 44.5 KB at 10^3 keys, more than the state); and ``changes``, the
    changes ``churn`` had made at its barrier (its position)."""
    manifest = os.path.join(c["url"], "MANIFEST.json")
    try:
        from pescheduler.checkpoint.storage import manifest_at
    except ImportError:                 # a version whose manifests list every file
        with open(manifest) as f:
            read = json.load(f)
    else:
        read = manifest_at(c["url"])
    listed = read["files"]
    files = [e for e in listed if e["chk"] == c["id"]]
    kind = lambda e: e["path"].rsplit(".", 1)[-1] if e["role"] == "group" else e["role"]
    out = {"full_bytes": 0, "delta_bytes": 0, "state_file_bytes": 0, "fulls": 0, "deltas": 0,
           "changes": sum(p.get("changes", 0) for p in read.get("positions", {}).values())}   # churn's, so far
    for e in files:
        k = kind(e)
        if k in ("full", "delta"):
            out[f"{k}_bytes"] += e["bytes"]
            out[f"{k}s"] += 1
        elif k == "state":
            out["state_file_bytes"] += e["bytes"]
    if "manifest_bytes" not in c:
        out["manifest_bytes"] = os.path.getsize(manifest)
        out["bytes"] = c["bytes"] + out["manifest_bytes"]
    return out


def changed_share(kinds: dict[int, dict], i: int, k: int) -> float:
    """The share of the K keys ``churn`` changed between checkpoint ``i``'s barrier and its
    predecessor's (the source's ``changes`` in their manifests' positions, :func:`written_by_kind`):
    1 % a checkpoint interval, more after a checkpoint that took longer than the interval (its
    successor's barrier waits for it, and the source keeps its rate). NaN for the first."""
    if i - 1 not in kinds:
        return float("nan")
    return (kinds[i]["changes"] - kinds[i - 1]["changes"]) / k


def stalls(path: str, k: int, start: float, end: float, ckpts: list[dict], moves: tuple | None = None,
           every_ckpt: list[dict] | None = None) -> dict:
    """From the sink's stamps: the fill's rate (the source's first read to the K-th output), and in [start, end) the
    largest gap between outputs that overlaps a checkpoint (trigger to commit; each checkpoint's own in its
    ``stall_ms``) and the median gap; beside them the stream's own gaps: the largest gap of each second
    that overlaps no checkpoint (of ``every_ckpt``: one begun before ``start`` too), their median and
    largest (``quiet_gap_p50_ms``, ``quiet_gap_max_ms``),
    so a stall reads against the machine's (at 10^7 on ``disk``, session 55: 8.2 and 21.7 ms
    against checkpoints' 27.4 and 50.5); ``moves``: the
    span from the Replicate's call to the end of the Release's (its last key group in), whose largest gap between
    outputs is the stream's stall while the groups move (``move_gap_ms``)."""
    with open(path) as f:
        lines = [(float(t), int(n)) for t, n in (line.split() for line in f if line.strip())]
    moving = [t for t, _ in lines if moves and moves[0] <= t <= moves[1]]
    move_gap = max((b - a for a, b in zip(moving, moving[1:])), default=float("nan"))
    done, fill_end = 0, None
    for t, n in lines:
        done += n
        if done >= k:
            fill_end = t
            break
    times = [t for t, _ in lines if start <= t < end]
    gaps = list(zip(times, times[1:]))
    for c in ckpts:                     # each checkpoint's own largest gap (printed under the row)
        c["stall_ms"] = 1000 * max((b - a for a, b in gaps if b > c["time"] and a < c["time"] + c["duration_s"]),
                                   default=float("nan"))
    every = sorted(b - a for a, b in gaps)
    spans = [(c["time"], c["time"] + c["duration_s"]) for c in every_ckpt or ckpts]
    quiet: dict[int, float] = {}        # second -> its largest gap overlapping no checkpoint
    for a, b in gaps:
        if not any(b > s and a < e for s, e in spans):
            quiet[int(a)] = max(quiet.get(int(a), 0.0), b - a)
    seconds = sorted(quiet.values())
    with open(path + ".start") as f:
        began = float(f.read())
    return {"fill_rate": k / (fill_end - began) if fill_end else 0.0,
            "stall_ms": max((c["stall_ms"] for c in ckpts if c["stall_ms"] == c["stall_ms"]), default=float("nan")),
            "gap_p50_ms": 1000 * every[len(every) // 2] if every else float("nan"), "move_gap_ms": 1000 * move_gap,
            "quiet_seconds": len(seconds), "quiet_gap_p50_ms": 1000 * seconds[len(seconds) // 2] if seconds else float("nan"),
            "quiet_gap_max_ms": 1000 * seconds[-1] if seconds else float("nan")}


def table(sizes: list[int], backends_: list[str]) -> None:
    import math

    print(f"\n6. issue 30's table: churn -> key_by -> latest (K keys) -> stamps, 2 workers, checkpoints every 1 s,")
    print(f"   1 % of the keys changed per second, pescheduler.state.cache={CACHE}; one deployment (one process) each")
    for k in sizes:
        if interval_for(k) != 1:
            capped = k // 100 > CHANGES_PER_S
            print(f"   K = {k:,}: checkpoints every {interval_for(k):g} s, 1 % of the keys changed in each"
                  + (f" (1 % per second would be more than {CHANGES_PER_S:,} changes/s, more than this pipeline "
                     f"keeps up with here)" if capped else ""))
    print(f"   stall: the largest gap between latest's outputs overlapping a checkpoint (p50 gap beside it);")
    print(f"   1% ckpt: bytes written (its manifest included) / state referenced, the largest of {CHECKPOINTS}")
    print(f"   checkpoints in the steady stream that followed at most {100 * ABOUT_1_PCT:g} % of the keys changed (c below:")
    print(f"   the share changed since the previous barrier; more after a checkpoint longer than the interval)")
    print(f"   (the checkpoint right after the Release is not one of them: it writes the groups the Release moved")
    print(f"   in whole, a rescale's cost, shown on the line under each row with every checkpoint's share);")
    print(f"   first out: SIGKILL of latest's worker -> first output after the restore; x dicts: the fill's rate")
    print(f"   against latest_in_dicts (the same pipeline, rows in one plain dict); rocksdb: the same pipeline with")
    print(f"   latest_in_rocksdb, the binding's raw loop into a store opened as disk opens it (no reads of new keys,")
    print(f"   nothing kept for checkpoints, its rows not checkpointed): the least a fill through this binding costs")
    print(f"   goals: {GOALS}")
    print(f"{'K':>9} {'backend':8} {'Repl ms':>8} {'Rel ms':>7} {'stall ms':>9} {'p50 gap':>8} {'ckpt s':>7} "
          f"{'1% MB':>8} {'state MB':>9} {'1%/state':>9} {'first out s':>12} {'worker RSS':>11} "
          f"{'deployer RSS':>13} {'fill/s':>8} {'x dicts':>8}  goals")
    rows: dict = {}
    with tempfile.TemporaryDirectory() as root:
        for k in sizes:
            rows[k] = {}
            # a row takes minutes at 10^7: each one's figures as it ends. A baseline named among the
            # backends runs once: a second row of one (backend, K) found the first's files and waited
            # 900 s for a fill that never came
            for b in [*BASELINES, *(b for b in backends_ if b not in BASELINES)]:
                t0 = time.monotonic()
                r = rows[k][b] = child_of("--table", b, k, root)
                print(f"   ({k:,} {b} done in {time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}: "
                      + ", ".join(f"{f} {r[f]:.1f}" for f in ("replicate_ms", "release_ms", "stall_ms", "fill_rate",
                                                             "first_output_s") if f in r) + ")", flush=True)
            for b, r in rows[k].items():
                share = lambda c: c["bytes"] / max(c["state_bytes"], 1)
                after_rescale, steady = r["checkpoints"][0], r["checkpoints"][1:]
                # the goal's case: a checkpoint after about 1 % of the keys changed (not one after a
                # longer checkpoint, whose interval held more; each is printed with its share below)
                c = max([c for c in steady if not c.get("changed", 0) > ABOUT_1_PCT] or steady, key=share)
                ratio = share(c)
                first = r.get("first_output_s", float("nan"))
                x = r["fill_rate"] / max(rows[k]["dicts"]["fill_rate"], 1e-9)
                missed = [] if b in BASELINES else [name for name, ok in (
                    ("pause", max(r["replicate_ms"], r["release_ms"]) <= 100), ("stall", r["stall_ms"] <= 20),
                    ("1%", ratio <= 0.05), ("first out", first <= 5),
                    ("0.5x", b != "disk" or k != 10**6 or "memory" not in rows[k]
                     or r["fill_rate"] >= 0.5 * rows[k]["memory"]["fill_rate"])) if not ok]
                goals = "-" if b in BASELINES else ("met" if not missed else "not met: " + ", ".join(missed))
                ms = lambda key: f"{r[key]:.1f}" if key in r else "-"
                held = (f"{c['duration_s']:7.2f} {c['bytes'] / 1e6:8.3f} {c['state_bytes'] / 1e6:9.2f} {ratio:9.3f}"
                        if b != "rocksdb" else f"{'-':>7} {'-':>8} {'-':>9} {'-':>9}")  # (its rows are not checkpointed)
                print(f"{k:9d} {b:8} {ms('replicate_ms'):>8} {ms('release_ms'):>7} {r['stall_ms']:9.1f} "
                      f"{r['gap_p50_ms']:8.1f} {held} "
                      f"{'-' if math.isnan(first) else f'{first:.2f}':>12} {r['worker_rss'] / 2**20:8.0f} MB "
                      f"{r['deployer_rss'] / 2**20:10.0f} MB {r['fill_rate']:8.0f} {x:8.2f}  {goals}")
                if b != "rocksdb":
                    print(f"{'':9} {'':8} each checkpoint, % of the state written (f: whole groups, d: deltas, bytes "
                          f"of the .state files s and of the manifest m, % of the keys changed c, its stall ms): "
                          + " ".join(f"{100 * share(c):.1f}({c['fulls']}f,{c['deltas']}d,{c['state_file_bytes']}s,"
                                     f"{c['manifest_bytes']}m, {100 * c.get('changed', float('nan')):.1f}%c, "
                                     f"{c.get('stall_ms', float('nan')):.1f}ms)"
                                     for c in r["checkpoints"])
                          + f"; the first follows the Release: {100 * share(after_rescale):.1f} %"
                          + f"; attempts aborted by the end of the fill's checkpoint / the moves / the steady part: "
                            f"{r['aborted']['fill']} / {r['aborted']['moves']} / {r['aborted']['steady']}")
                if r.get("quiet_seconds"):      # the stream's own gaps, for the stall to be read against
                    print(f"{'':9} {'':8} outside checkpoints, the largest gap of each second: median "
                          f"{r['quiet_gap_p50_ms']:.1f} ms, largest {r['quiet_gap_max_ms']:.1f} ms "
                          f"({r['quiet_seconds']} seconds); the stall above is the largest overlapping a checkpoint")
                if r.get("cpu"):                # the machine's two cores in the steady part
                    print(f"{'':9} {'':8} CPU in the steady part, % of one core: " + "; ".join(
                        f"{who} worker: loop {100 * c.get('loop_run', 0):.0f} (waited for a CPU "
                        f"{100 * c.get('loop_wait', 0):.0f}), other Python threads {100 * c.get('python_run', 0):.0f}, "
                        f"RocksDB {100 * c.get('rocksdb_run', 0):.0f}" for who, c in sorted(r["cpu"].items(), reverse=True)))
                for e in r.get("threaded", ()):  # the PEs' moves to their threads and back (worker/turns.py)
                    print(f"{'':9} {'':8} at {e['t']:.1f} s: {e['text']}")
                if b not in BASELINES and "rocksdb" in rows[k]:   # the fill against the binding's own loop
                    print(f"{'':9} {'':8} the fill: {r['fill_rate'] / max(rows[k]['rocksdb']['fill_rate'], 1e-9):.2f}x "
                          f"rocksdb's (the binding's raw loop in this pipeline)")
                if b not in BASELINES:          # after each pause: the groups' move, the stream running on
                    done = lambda name: r.get(f"{name}_steps", {}).get("moving: done ms after the pause", float("nan"))
                    longest = max(r.get(f"{name}_steps", {}).get("moving: longest import ms", float("nan"))
                                  for name in ("replicate", "release"))
                    print(f"{'':9} {'':8} the moves: the key groups all in {done('replicate'):.0f} ms after the "
                          f"Replicate's pause, {done('release'):.0f} ms after the Release's; the largest gap between "
                          f"outputs from the Replicate to the last group in {r['move_gap_ms']:.1f} ms; the longest "
                          f"import of a group in a turn {longest:.1f} ms")
                for name in ("replicate", "release"):      # the record's largest steps: where the pause went
                    steps = sorted(((s, ms_) for s, ms_ in r.get(f"{name}_steps", {}).items()
                                    if not s.startswith(OUTSIDE_THE_PAUSE)), key=lambda kv: -kv[1])[:4]
                    steps += [(s, ms_) for s, ms_ in r.get(f"{name}_steps", {}).items()    # when the marker left
                              if s.endswith(" held") and not s.startswith(OUTSIDE_THE_PAUSE) and (s, ms_) not in steps]
                    if steps:
                        print(f"{'':9} {'':8} {name} steps (ms): " + ", ".join(f"{s} {ms_:.1f}" for s, ms_ in steps))
    deployer = [r["deployer_rss"] / 2**20 for by in rows.values() for b, r in by.items() if b not in BASELINES]
    print(f"   deploying process RSS over K = {min(rows):,}..{max(rows):,}: {min(deployer):.0f}-{max(deployer):.0f} MB "
          f"(goal: independent of the state's size)")


# -- 7. checkpoints of a first full write longer than checkpoint.timeout --------------------------

def attempts(sizes: list[int], backends_: list[str], timeout: float, limit: float = 600) -> None:
    """Issue 30's 10^7 row stopped because its checkpoints took longer than ``checkpoint.timeout``
    and each next attempt wrote the state whole again (then attempts built on each other; since
    session 62 the timeout bounds a write without progress). Here the same pipeline (``churn`` ->
    ``latest``, 2 workers, checkpoints every second) with the timeout lowered, so that at K keys the
    first checkpoint cannot be written within it: per checkpoint id, the keys in ``latest`` at its
    first file, the bytes of key-group files in its directory in the storage and in the workers'
    copies of what they wrote (``state/local.py``: kept until a checkpoint completes, so an
    attempt's writes count even after the storage's were removed), both polled every 0.1 s and the
    most seen kept, and how it ended, until
    two complete after the fill, twelve were tried after it, or ``limit`` s."""
    import re

    import dask.config

    import pescheduler
    from pescheduler import Application

    print(f"\n7. a first checkpoint longer than checkpoint.timeout = {timeout:g} s: each attempt's group files")
    for backend in backends_:
        for k in sizes:
            with tempfile.TemporaryDirectory() as root:
                os.environ["PESCHEDULER__STATE__CACHE"] = CACHE
                os.environ["PESCHEDULER__STATE__DIR"] = root
                until, ckpt = os.path.join(root, "done"), os.path.join(root, "ckpt")
                app = Application(f"attempts-{backend}-{k}")
                (app.source("churn", keys=k, until=until, changes=max(1, k // 100)).key_by("id")
                    .apply("latest", id="state").sink("stamps", path=os.path.join(root, "stamps")))
                seen: dict[int, dict] = {}
                t0 = time.monotonic()
                with dask.config.set({"pescheduler.checkpoint.timeout": f"{timeout}s"}), \
                        pescheduler.deploy(app, workers=2, plugins=["benchops"], policies=[], state=backend,
                                           checkpoint=ckpt, checkpoint_interval="1s") as dep:
                    filled_at = None
                    while time.monotonic() - t0 < limit:
                        ops = dep.snapshot().operators
                        keys = ops["state"].tuples_in if "state" in ops else 0
                        if filled_at is None and keys >= k:
                            filled_at = time.monotonic() - t0
                        for folder, _, names in os.walk(root):      # the storage, and the workers' copies
                            m = re.search(r"chk-(\d+)$", folder)
                            if m:
                                cid, where = int(m.group(1)), "" if folder.startswith(ckpt) else "copy_"
                                row = seen.setdefault(cid, {"keys": keys, "at": time.monotonic() - t0, "bytes": 0,
                                                            "files": 0, "copy_bytes": 0, "copy_files": 0})
                                sizes_ = [_size(os.path.join(folder, n)) for n in names if re.search(r"\.g\d{3}\.|\.seg\d+$", n)]
                                if sum(sizes_) > row[f"{where}bytes"]:
                                    row.update({f"{where}bytes": sum(sizes_), f"{where}files": len(sizes_)})
                        after = [cid for cid, row in seen.items() if row["keys"] >= k]
                        if len([c for c in dep.checkpoints() if c["id"] in after]) >= 2 or len(after) >= 12:
                            break                   # two complete after the fill, or twelve attempts
                        time.sleep(0.1)             # polling the storage, bounded by limit
                    complete = {c["id"]: c for c in dep.checkpoints()}
                    status = dep.status()["checkpoints"]
                    why = {int(m.group(1)): m.group(2) for e in dep.status().get("events", ())
                           if (m := re.match(r"checkpoint (\d+) aborted: (.*)", e["text"]))}
                    open(until, "w").close()
                    dep.wait(timeout=300)
                print(f"   {backend}, K = {k:,} (filled at {filled_at or float('nan'):.0f} s; "
                      f"{status['completed']} complete, {status['aborted']} aborted; load {os.getloadavg()[0]:.1f})")
                print(f"   {'id':>4} {'at s':>6} {'keys':>10} {'stored MB':>10} {'files':>6} {'written MB':>11} "
                      f"{'files':>6}  ended")
                for cid, row in sorted(seen.items()):
                    c = complete.get(cid)
                    ended = (f"complete in {c['duration_s']:.1f} s, wrote {c['bytes'] / 1e6:.1f} MB, references "
                             f"{c['state_bytes'] / 1e6:.1f} MB") if c else f"aborted: {why.get(cid, '(or cut short)')}"
                    print(f"   {cid:4d} {row['at']:6.1f} {row['keys']:10,} {row['bytes'] / 1e6:10.2f} {row['files']:6d} "
                          f"{row['copy_bytes'] / 1e6:11.2f} {row['copy_files']:6d}  {ended}", flush=True)


def _size(path: str) -> int:
    """A file's size; 0 when it went meanwhile (an aborted checkpoint's, removed)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] in ("--one", "--checkpoint", "--window", "--table"):
        one = {"--one": one_backend, "--checkpoint": one_checkpoint, "--window": one_window,
               "--table": one_table_row}[sys.argv[1]]
        print(json.dumps(one(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1000,10000,100000,1000000", help="comma-separated K")
    parser.add_argument("--huge", action="store_true", help="add K = 10^7 (minutes, GBs)")
    parser.add_argument("--quick", action="store_true",
                        help="K = 10^3 and 10^4 only (the live parts 3 and 6: 10^3; under a minute)")
    parser.add_argument("--parts", default="1,2,3,4,5,6",
                        help="which parts to run (3 and 6: the deployments; 6: issue 30's table)")
    parser.add_argument("--backends", default="memory,disk", help="backends of parts 3, 4 and 6")
    parser.add_argument("--timeout", type=float, default=2.0,
                        help="part 7: pescheduler.checkpoint.timeout (s), shorter than the first full write")
    parser.add_argument("--checkpoints", type=int, default=None,
                        help="steady checkpoints each table row waits for (default 10; --quick: 2)")
    parser.add_argument("--hot", type=int, default=0,
                        help=f"part 3: after the fill {HOT_RATE} tuples/s go on, 90 %% of them over this many keys "
                             "(each move's tuples held and their mean wait; 0: no tuples after the fill)")
    args = parser.parse_args()
    os.environ["STATE_BENCH_CHECKPOINTS"] = str(args.checkpoints or (2 if args.quick else 10))
    os.environ["STATE_BENCH_INTERVAL"] = "0.5" if args.quick else "1"
    global CHECKPOINTS
    CHECKPOINTS = int(os.environ["STATE_BENCH_CHECKPOINTS"])
    sizes = [1000, 10_000] if args.quick else [int(x) for x in args.keys.split(",")]
    if args.huge:
        sizes.append(10**7)
    print(f"load average {os.getloadavg()[0]:.1f} (figures (L) on a loaded machine: compare ratios)")
    parts, chosen = {int(p) for p in args.parts.split(",")}, args.backends.split(",")
    for part, run in ((1, backends), (2, window_state), (3, lambda s: live(s[:1] if args.quick else s, chosen, args.hot)),
                      (4, lambda s: checkpoints(s, chosen)), (5, windows), (6, lambda s: table(s[:1] if args.quick else s, chosen)),
                      (7, lambda s: attempts(s, chosen, args.timeout))):
        if part in parts:
            run(sizes)


if __name__ == "__main__":
    main()

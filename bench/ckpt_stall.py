"""The stall a checkpoint causes a PE, in one process: what holds the PE's thread, and for how long.

    python bench/ckpt_stall.py [--keys 1000000] [--backend memory] [--op state|window] [--checkpoints 4]
                               [--changed 0.01] [--hot N] [--trace] [--profile] [--quick] [--as-worker]

K keys in a keyed state (values a window's slots, as bench/state.py's), then per checkpoint: 1 % of
the keys changed, a snapshot taken as the barrier takes it (``pickle_snapshot``), and the worker's
write (``CheckpointFiles.write``) in a thread of its own, as ``pe_ckpt_write`` runs it. Beside it a
"PE" thread does what ``latest`` does per tuple (a get, a changed copy put back, one more key
ticking) and notes its own gaps. Per checkpoint: the barrier's stall, the write's time, and the
largest gap of the PE thread while the write ran (its p50 beside it), against the largest gap with
no write running, and the bytes the checkpoint wrote of the state it references. ``--trace``: the cyclic GC's collections (generation, ms) and the writer thread's
longest calls into C (a profile hook on that thread only: the calls that hold the GIL whole).
``--profile``: the writer's functions by their own time, per checkpoint (cProfile, that thread only).
``--as-worker``: the process set up as a worker's PE host is (``worker/process_settings.py``: the
GIL's switch interval, the collector freezing a full collection's survivors; restarted on the
allocator a worker is started with, ``pescheduler/allocator.py``; distributed loaded), as deployed.
``--op window``: the keys are a time window's instead (``count`` and ``sum`` of one field, every key
in one open pane: ``operators/window.py``, its panes on ``memory`` its own dicts), and the PE thread
folds 20 tuples of random keys a turn into it (``Window.process``); the barrier takes its snapshot.
``--op columnar``: the same window fed Arrow RecordBatches only, so its panes are numpy arrays.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import random
import shutil
import sys
import tempfile
import threading
import time

VALUE = [12, 345.5, 1.25, 99.75]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PE(threading.Thread):
    """A keyed operator's per-tuple work on ``state``, noting the time between two tuples."""

    def __init__(self, state, keys: list[str]) -> None:
        super().__init__(daemon=True, name="pe")
        self.state, self.keys, self.stop = state, keys, threading.Event()
        self.marks: list[tuple[float, float]] = []      # (when, gap before it)
        self.lock = threading.Lock()                    # the barrier's snapshot runs "in the PE's turn"

    def run(self) -> None:
        rng, last = random.Random(1), time.perf_counter()
        while not self.stop.is_set():
            with self.lock:
                self.turn(rng)
            now = time.perf_counter()
            self.marks.append((now, now - last))
            last = now
            time.sleep(0.0005)          # the PE waits for its next input: 20 tuples per wake-up

    def turn(self, rng: random.Random) -> None:
        for _ in range(20):
            key = self.keys[rng.randrange(len(self.keys))]
            value = list(self.state.get(key) or VALUE)
            value[0] += 1
            self.state.put(key, value)
        self.state.put("tick", [time.perf_counter()])

    def gaps(self, t0: float, t1: float, inside: bool = False) -> list[float]:
        """The gaps overlapping ``[t0, t1)``; ``inside``: only those within it (not the change of
        1 % of the keys just before, a turn of its own, nor the barrier just after)."""
        if inside:
            return sorted(g for t, g in self.marks if t0 <= t - g and t < t1)
        return sorted(g for t, g in self.marks if t0 <= t - g and t - g < t1 or t0 <= t < t1)


class WindowPE(PE):
    """A time window's fold instead: 20 tuples of random keys a turn, all in its one open pane."""

    def __init__(self, window, keys: list[str], op: str) -> None:
        super().__init__(None, keys)
        from pescheduler.operator import Emitter

        self.window, self.out, self.op = window, Emitter(), op

    def turn(self, rng: random.Random) -> None:
        keys = self.keys
        self.window.process(rows([keys[rng.randrange(len(keys))] for _ in range(20)], 1.0, self.op), self.out)


def rows(keys: list[str], v: float, op: str):
    """A batch of a window's tuples of ``keys``, every one in the same pane: rows, or (``columnar``)
    one Arrow RecordBatch."""
    if op == "columnar":
        import pyarrow as pa

        return pa.RecordBatch.from_pydict({"key": keys, "v": [v] * len(keys), "ts": [1] * len(keys)})
    return [{"key": key, "v": v, "ts": 1} for key in keys]


class LongCalls:
    """The C calls of one thread (``threading.setprofile`` set in it) that took more than 2 ms of
    its CPU (``time.thread_time``: a call waiting for the GIL or the disk counts wall, not CPU):
    ``(start, wall s, cpu s, what)``."""

    def __init__(self) -> None:
        self.started: dict = {}
        self.calls: list[tuple[float, float, float, str]] = []

    def __call__(self, frame, event, arg) -> None:
        if event == "c_call":
            self.started[id(arg)] = (time.perf_counter(), time.thread_time())
        elif event in ("c_return", "c_exception"):
            t = self.started.pop(id(arg), None)
            if t is not None:
                cpu = time.thread_time() - t[1]
                if cpu > 0.002:
                    where = f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno}"
                    self.calls.append((t[0], time.perf_counter() - t[0], cpu,
                                       f"{getattr(arg, '__qualname__', arg)} at {where}"))


def in_gaps(pe: PE, collections: list[tuple[float, float, int]], t0: float, t1: float) -> str:
    """The collections inside the PE's three largest gaps within ``t0`` to ``t1``: ``gap ms: gen N
    ms, ...`` (a collection holds the GIL: every thread stops)."""
    worst = sorted((g, t) for t, g in pe.marks if t0 <= t - g and t < t1)[-3:][::-1]
    return "; ".join(f"{1000 * g:.0f}: " + (", ".join(f"gen {gen} {1000 * took:.0f}" for at, took, gen in collections
                                                      if at < t and at + took > t - g) or "none")
                     for g, t in worst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--backend", default="memory")
    parser.add_argument("--op", default="state", choices=("state", "window", "columnar"),
                        help="a keyed state's values (as latest), a time window's panes, or its Arrow panes "
                             "(every batch a RecordBatch: operators/columnar_window.py)")
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--changed", type=float, default=0.01,
                        help="share of the keys changed before each checkpoint (0.1 at 10^6: the 10^5 keys of a "
                             "steady checkpoint at 10^7)")
    parser.add_argument("--hot", type=int, default=0,
                        help="the PE thread's tuples on the first N keys only (default: all of them; on a window its "
                             "changes then join the 1 %% in each checkpoint's delta: --hot 1000 for the bytes of a "
                             "checkpoint after 1 %% changed)")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--quick", action="store_true", help="10^4 keys, two checkpoints (a smoke test)")
    parser.add_argument("--as-worker", action="store_true",
                        help="this process set up as a worker's (switch interval, collector), as deployed")
    args = parser.parse_args()
    if args.quick:
        args.keys, args.checkpoints = 10_000, 2
    import dask.config

    from pescheduler.checkpoint import CheckpointStore
    from pescheduler.state import open_state
    from pescheduler.state.groups import snapshot_groups
    from pescheduler.state.incremental import pickle_snapshot
    from pescheduler.worker.ckpt_files import CheckpointFiles

    if args.as_worker:
        import distributed  # noqa: F401  (a worker has it loaded, numpy with it: not imported by the first write)

        from pescheduler import allocator
        from pescheduler.worker import process_settings

        preload = allocator.preload_env()
        if preload and allocator.in_use() != "jemalloc":    # on the allocator a worker is started with
            os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **preload})
        process_settings.apply()
    root = tempfile.mkdtemp(prefix="ckpt-stall-")
    dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": "512MB"})
    keys = [f"car-{i:07d}" for i in range(args.keys)]
    t0 = time.perf_counter()
    if args.op != "state":
        from pescheduler.operator import Emitter, OperatorContext
        from pescheduler.operators.window import Window

        st = Window(10**12, aggregates={"n": ("count", "v"), "s": ("sum", "v")})
        st.open(OperatorContext("w", pe_id="pe", key_field="key", extra={"state": args.backend}))
        for b in range(0, len(keys), 1000):
            st.process(rows(keys[b:b + 1000], 1.0, args.op), Emitter())
        if args.op == "columnar" and st._cols is None:
            raise SystemExit("the window took the row path: no columnar panes to measure")
    else:
        st = open_state(args.backend, owner="stall")
        for key in keys:
            st.put(key, list(VALUE))
    print(f"load average {os.getloadavg()[0]:.1f}; {args.keys:,} keys on {args.backend} in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    collections: list[tuple[float, float, int]] = []
    began: dict = {}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began["t"] = time.perf_counter()
        elif "t" in began:
            collections.append((began["t"], time.perf_counter() - began.pop("t"), info["generation"]))

    gc.callbacks.append(on_gc)          # cheap: each row names the collections inside its largest gap
    store, files = CheckpointStore(os.path.join(root, "ckpt"), b"k" * 32), CheckpointFiles()
    ticking = keys[:args.hot] if args.hot else keys
    pe = WindowPE(st, ticking, args.op) if args.op != "state" else PE(st, ticking)
    pe.start()
    rng = random.Random(7)
    print(f"{'ckpt':>4} {'barrier ms':>10} {'write s':>8} {'max gap ms':>10} {'p50 gap':>8} {'idle max gap':>12}"
          f"  (idle: the second before the barrier)")
    for cid in range(1, args.checkpoints + 1):
        with pe.lock:                   # 1 % of the keys changed, in the PE's turns
            changed = rng.sample(keys, max(1, int(args.keys * args.changed)))
            if args.op != "state":
                st.process(rows(changed, 2.0, args.op), Emitter())
            else:
                for key in changed:
                    st.put(key, [13, 0.0, 0.0, 0.0])
        idle0 = time.perf_counter()
        time.sleep(1.0)
        idle1 = time.perf_counter()
        with pe.lock:
            b0 = time.perf_counter()
            state = st.snapshot() if args.op != "state" else {"groups": snapshot_groups(st)}
            blob, views = pickle_snapshot({"op": {"state": state}})
            barrier = time.perf_counter() - b0
        files.hold("bench", cid, "pe", {"state": blob, "views": views, "positions": {}})
        del views, state, blob          # held by the worker until its write ends, as deployed
        long_calls = LongCalls()
        sizes = [0, 0]                  # bytes this checkpoint wrote, bytes of state it references

        def write() -> None:
            if args.trace:
                threading.setprofile(None)
                sys.setprofile(long_calls)
            profile = cProfile.Profile() if args.profile else None
            if profile is not None:
                profile.enable()
            try:
                written = files.write("bench", cid, ["pe"], store.url)["pe"]["files"]
                sizes[:] = sum(f["bytes"] for f in written if f["chk"] == cid), sum(f["bytes"] for f in written)
                store.commit_manifest(cid, {"id": cid, "files": written})
                files.end("bench", cid, complete=True)
            finally:
                sys.setprofile(None)
                if profile is not None:
                    profile.disable()
                    pstats.Stats(profile).sort_stats("tottime").print_stats(12)

        w0 = time.perf_counter()
        writer = threading.Thread(target=write, name="ckpt-writer")
        writer.start()
        writer.join(600)
        w1 = time.perf_counter()
        gaps, idle = pe.gaps(b0, w1), pe.gaps(idle0, idle1, inside=True)
        print(f"{cid:4d} {1000 * barrier:10.1f} {w1 - w0:8.2f} {1000 * max(gaps, default=0):10.1f} "
              f"{1000 * gaps[len(gaps) // 2] if gaps else 0:8.2f} {1000 * max(idle, default=0):12.1f}  written {sizes[0] / 1e6:.2f} of "
              f"{sizes[1] / 1e6:.2f} MB; RSS "
              f"{rss_mb():.0f} MB, trims so far {getattr(getattr(files, '_trims', None), 'trimmed', 'every write')}; "
              f"collections in the largest gaps: {in_gaps(pe, collections, idle0, w1)}", flush=True)
        if args.trace:
            for t, took, gen in collections:
                if b0 <= t < w1:
                    print(f"     gc generation {gen}: {1000 * took:.1f} ms")
            for start, wall, cpu, what in sorted(long_calls.calls, key=lambda c: -c[2])[:6]:
                print(f"     writer C call {1000 * cpu:.1f} ms CPU ({1000 * wall:.1f} wall) @ {start - b0:.2f}: {what}")
            worst = sorted((g, t) for t, g in pe.marks if b0 <= t < w1)[-3:]
            for g, t in worst:
                during = [c[3] for c in long_calls.calls if c[0] < t and c[0] + c[1] > t - g]
                gcs = [f"gen {gen} {1000 * took:.0f} ms" for at, took, gen in collections if at < t and at + took > t - g]
                print(f"     gap {1000 * g:.1f} ms ending @ {t - b0:.2f}: writer in {during[:3]}, gc {gcs}")
        collections.clear()
    pe.stop.set()
    pe.join(10)
    if args.op == "state":
        st.close()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

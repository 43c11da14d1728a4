"""join, over_window and pattern in the keyed state backend (memory) against their dicts (a checkout before them).

    python bench/keyed_ops.py OLD_OPERATORS_DIR [EVENTS] [PER_MS]

``OLD_OPERATORS_DIR``: the ``operators/`` of a checkout from before (e.g. ``git worktree add
/tmp/old c6a50a4``: ``/tmp/old/operators``). For 10^2, 10^3 and 10^4 keys that come and go (a
quarter of the key space replaced every 4K events), each operator runs EVENTS events (default
40,000) in batches of 200 with a watermark per batch and a snapshot every 50, old and new
interleaved three times; it prints the median time ratio new/old (and the three). ``PER_MS``
events per ms of event time (default 1): with more than 1, each key has about 5 events in the
window; with 1, a 100 ms window in which every event's key is new (the backend's worst case:
a get, a put and a delete per event).
"""
import gc
import importlib.util
import statistics
import sys
import time

from pescheduler.operator import Emitter, OperatorContext

def load(name, path):
    spec = importlib.util.spec_from_file_location(f"pescheduler.operators._old_{name}", path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); return mod

OLD = {n: load(n, f"{sys.argv[1]}/{n}.py") for n in ("join", "over_window", "pattern")}
NEW = {n: importlib.import_module(f"pescheduler.operators.{n}") for n in ("join", "over_window", "pattern")}
N, B = int(sys.argv[2]) if len(sys.argv) > 2 else 40_000, 200

def key(i, K):          # a quarter of the key space replaced every 4K events
    return (i % K) + (i // (4 * K)) * (K // 4)

PER_MS = int(sys.argv[3]) if len(sys.argv) > 3 else 1      # events per ms of event time

def make(kind, mod, K):
    # the window: each key has about 5 of its events in it (PER_MS > 1) or 100 ms (sparse: ~0 or 1)
    span = max(1, 5 * K // PER_MS) if PER_MS > 1 else 100
    if kind == "join":
        return mod.Join(within=span // 2, on="k")
    if kind == "over_window":
        return mod.OverWindow(span, {"c": "count", "s": ("sum", "v")}, key="k")
    return mod.Pattern("x y+", define={"x": lambda e, m: e["v"] % 3 == 0, "y": lambda e, m: e["v"] % 3 != 0},
                       within=span, key="k")

def run(kind, mod, K):
    op = make(kind, mod, K)
    op.open(OperatorContext(op_id="b", extra={"state": "memory"}))
    events = [{"k": key(i, K), "ts": i // PER_MS, "v": i // K} for i in range(N)]
    gc.collect()
    t = time.perf_counter()
    for b in range(0, N, B):
        out = Emitter()
        batch = events[b:b + B]
        if kind == "join":
            op.on_left(batch, out); op.on_right(batch, out)
        else:
            op.process(batch, out)
        op.on_watermark((b + B) // PER_MS - 20, out)
        if b % (50 * B) == 0:
            op.snapshot()                       # a checkpoint every 50 batches
    return time.perf_counter() - t

for K in (100, 1_000, 10_000):
    for kind in ("join", "over_window", "pattern"):
        ratios = []
        for _ in range(3):
            old = run(kind, OLD[kind], K)
            new = run(kind, NEW[kind], K)
            ratios.append(new / old)
        runs = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"{kind:12s} keys={K:>6}: new/old time {statistics.median(ratios):.2f}x (runs {runs})", flush=True)

"""Keyed operators on the ``memory`` state backend against the same operators on a plain dict.

    python bench/keyed_operators.py [--keys 1000,10000,100000] [--repeat 5] [--only join,pattern] [--quick] [--cpu] [--disk]

The one bench of issue 30: every KEYED operator that keeps its state in the backend
(count_window, session_window, latest, process, join_asof, lookup, join (interval),
over_window, pattern, ep_patterns (SharedPatterns), ep_over (OverLanes),
changelog_aggregate) runs the same stream three ways per repetition, in rotating order:

  dict     its state a bare dict (``get`` and ``put`` the dict's own methods, every key
           writable in place, a sweep of every key one pass over the dict: ``groups()`` is
           one pseudo group, the whole dict, so no key is hashed to its group): what the
           operator costs holding its own dict
  memory   the ``memory`` backend (pescheduler/state/memory.py), a checkpoint's snapshot
           every CHECKPOINT batches, its view released at once (the common case: no view
           live while tuples are processed; the snapshot's fold is counted)
  live     the same, the view live through the next batch (a checkpoint's files being
           written meanwhile): ``get`` copies a value the view shares, as the contract asks

The baseline is the operator's own code on that dict, for every operator: none of them has a
dict version on main any more, and running the same code is the strongest simple dict fold of
the same work (the same events, the same outputs, the state changed in place; only what the
backend adds is measured). Per operator, the dict run is:

  count_window        a 4-tuple count window per key, count and sum: a dict key -> open window
  session_window      sessions (gap a quarter of the stream), count and sum: key -> open session
  latest              a changelog's last row per key (one change in ten a delete): key -> row
  process             a count per key and a timer at its first event (a Process): key -> its state
  join_asof           left/right of the same keys, as-of by ts: key -> its buffered sides
  lookup              a table's changes (one in ten a delete) and probes: key -> the table's row
  join                an interval join (within ~5 of a key's events): key -> [lefts, rights],
                      purged by one pass over the dict
  over_window         count and sum over ~5 of a key's events: key -> [window deque, slots]
  pattern             ``x y+`` within the same window: key -> its runs
  ep_patterns         two shared pattern queries (``x y+``, ``x y y``): key -> {family: runs}
  ep_over             two lanes (the window and half of it): key -> {size: [deque, slots]}
  changelog_aggregate additions and (for half the events) the retraction of the key's row
                      first; sum, count, max: group -> [rows, slots, {field: Counter}, version]

A batch runs with the cyclic garbage collector paused, a watermark with it running, as the
worker's chain runs them (pescheduler/worker/chain.py ``emit_from``): a collection's pass over the
heap visits a key's value twice on ``memory`` (the flat index and its group's dict), once on a
dict, so where the collector runs decides much of the gap at 10^5 keys (lookup, CPU time, load
10-14: the dict 115 ms with no collection against 200 ms with it running throughout, memory 160
against 340).

K live keys; keys come and go (the key space slides by 2K over the stream, so most keys
are first touched after a snapshot and some retire; latest and lookup delete keys). A
stream is max(100000, 2K) tuples in batches of 1000, a watermark after each batch. The
columns memory/dict and live/dict are dict time / memory (live) time (1.0: as fast as the dict;
below 1: slower), best of the repetitions of each; the runs must agree on (keys held at the
end, tuples emitted) or the bench exits. Only ratios are comparable on a loaded machine (the
load average is printed). ``--quick``: K = 1000, one repetition, a short stream (a smoke test).
``--cpu``: each run's CPU time (its thread's, ``time.thread_time``) instead of the time that
passed: on a shared machine the time a run waits for a core is not the operator's (its caches
are still shared, so interleave and compare ratios all the same). ``--disk``: a fourth run on the
``disk`` backend (a snapshot every CHECKPOINT batches, released at once, as ``memory``), its time
and disk/memory (memory time / disk time: the issue's goal is >= 0.5 at 10^6 keys).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import random
import shutil
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pescheduler.operator import Emitter, OperatorContext  # noqa: E402
from pescheduler.state import KeyedState, key_group  # noqa: E402

BATCH = 1000
DISK_CACHE = "512MB"                                                               # --disk: pescheduler.state.cache (bench/state.py's)
CHECKPOINT = int(os.environ.get("CHECKPOINT", 10))                                # batches between two snapshots of the memory run
AGGS = {"n": ("count", "v"), "s": ("sum", "v")}
WHOLE = -1                                                                         # DictState's one pseudo group


class DictState(KeyedState):
    """The baseline: an operator's own dict behind the contract (no snapshot, no key groups kept)."""

    backend = "dict"

    def __init__(self) -> None:
        table = self._table = {}
        self.get, self.put = table.get, table.__setitem__     # the dict's own methods: no call of ours
        self._track()

    def get(self, key: Any, default: Any = None) -> Any:      # shadowed in __init__
        return self._table.get(key, default)

    def put(self, key: Any, value: Any) -> None:              # shadowed in __init__
        self._table[key] = value

    def delete(self, key: Any) -> None:
        self._table.pop(key, None)

    def write_many(self, puts, deletes=()) -> None:               # what an operator's dict would do
        self._table.update(puts)
        for key in deletes:
            self._table.pop(key, None)

    def writable(self) -> dict:
        return self._table

    def __len__(self) -> int:
        return len(self._table)

    def items(self, group: int):
        if group == WHOLE:                                    # a sweep: the dict itself, no key hashed
            return iter(self._table.items())
        return iter([(k, v) for k, v in self._table.items() if key_group(k) == group])

    def groups(self) -> list[int]:
        """One pseudo group, the whole dict: an operator's sweep (``for g in groups(): items(g)``)
        is one pass over its dict, as it was when the operator held the dict itself."""
        return [WHOLE] if self._table else []

    def entries(self):
        return iter(self._table.items())

    def snapshot(self):
        raise NotImplementedError("the dict baseline takes no snapshot")

    def changed(self) -> set[int]:
        return set()

    def drop_groups(self, groups) -> None:
        for g in set(groups):
            for k, _ in list(self.items(g)):
                del self._table[k]

    def _put_group(self, group: int, entries: dict) -> None:
        self.drop_groups([group])
        self._table.update(entries)


def key_stream(n: int, k: int, seed: int) -> list[int]:
    """n keys among k live ones, the live range sliding by 2k over the stream (keys come and go)."""
    rnd = random.Random(seed)
    return [i * 2 * k // n + rnd.randrange(k) for i in range(n)]


# -- the operators: each makes (operator, the attribute holding its state, its batches) ----------
# A batch is (input, tuples): input None for process(), 0/1 for process_input(); a watermark follows.

def _events(n: int, k: int) -> list:
    return [{"key": key, "v": 1.0, "ts": i} for i, key in enumerate(key_stream(n, k, 1))]


def count_window(n: int, k: int):
    from pescheduler.operators.count_window import CountWindow

    return lambda: CountWindow(4, aggregates=AGGS), "_keys", [(None, b) for b in _batches(_events(n, k))]


def session_window(n: int, k: int):
    from pescheduler.operators.session import SessionWindow

    return lambda: SessionWindow(n // 4, AGGS), "_keys", [(None, b) for b in _batches(_events(n, k))]


def latest(n: int, k: int):
    from pescheduler.operators.latest import Latest

    rnd = random.Random(2)
    changes = [{"op": "delete", "key": key} if rnd.random() < 0.1 else
               {"op": "update", "key": key, "after": {"key": key, "v": i}}
               for i, key in enumerate(key_stream(n, k, 2))]
    return lambda: Latest(), "_rows", [(None, b) for b in _batches(changes)]


class Counter:
    """A process function: a count per key, an event-time timer at its first event (a session's end)."""

    def on_event(self, event: dict, ctx) -> None:
        state = ctx.state
        if not state:
            ctx.timers.at(event["ts"] + 5000)
        state["n"] = state.get("n", 0) + 1

    def on_timer(self, ts: int, key: Any, ctx) -> None:
        ctx.emit({"key": key, "n": ctx.state.pop("n", 0)})
        ctx.state.clear()


def process(n: int, k: int):
    from pescheduler.operators.process import Process

    return lambda: Process(Counter), "_keys", [(None, b) for b in _batches(_events(n, k))]


def _two_sides(n: int, k: int) -> list:
    """Left and right events of the same keys, a batch of each in turn."""
    rnd = random.Random(3)
    batches = []
    for b in _batches([{"key": key, "v": i, "ts": i} for i, key in enumerate(key_stream(n, k, 3))]):
        side = [t for t in b if rnd.random() < 0.5]
        batches += [(1, side), (0, [t for t in b if t not in side])]
    return batches


def join_asof(n: int, k: int):
    from pescheduler.operators.join_asof import AsofJoin

    return lambda: AsofJoin(by="key", on="ts"), "_keys", _two_sides(n, k)


def lookup(n: int, k: int):
    from pescheduler.operators.lookup import Lookup

    rnd = random.Random(4)
    batches = []
    for input_index, b in _two_sides(n, k):
        if input_index == 1:                       # table changes; one in ten a delete
            b = [{"op": "delete", "key": t["key"], "before": {"key": t["key"]}} if rnd.random() < 0.1 else
                 {"op": "update", "key": t["key"], "after": t, "ts": t["ts"]} for t in b]
        batches.append((input_index, b))
    return lambda: Lookup(key="key"), "_keys", batches


def _window(n: int, k: int) -> int:
    """A window of event time in which each key has about 5 of its events (a key recurs every ~k
    tuples while it lives, ts = the tuple's index), at most a quarter of the stream."""
    return max(1, min(5 * k, n // 4))


def join(n: int, k: int):
    from pescheduler.operators.join import Join

    span = _window(n, k)
    return lambda: Join(within=span // 2, on="key"), "_keys", _two_sides(n, k)


def over_window(n: int, k: int):
    from pescheduler.operators.over_window import OverWindow

    span = _window(n, k)
    return lambda: OverWindow(span, AGGS, key="key"), "_keys", [(None, b) for b in _batches(_events(n, k))]


def _marked(n: int, k: int) -> list:
    """Events whose ``v`` (0, 1, 2 in turn per tuple) the patterns' predicates test."""
    return [{"key": key, "v": i % 3, "ts": i} for i, key in enumerate(key_stream(n, k, 5))]


DEFINE = {"x": lambda e, m: e["v"] == 0, "y": lambda e, m: e["v"] != 0}


def pattern(n: int, k: int):
    from pescheduler.operators.pattern import Pattern

    span = _window(n, k)
    return (lambda: Pattern("x y+", define=DEFINE, within=span, key="key"), "_runs",
            [(None, b) for b in _batches(_marked(n, k))])


def ep_patterns(n: int, k: int):
    from pescheduler.operators.ep_pattern import SharedPatterns

    span = _window(n, k)
    queries = {"plus": {"pattern": "x y+", "define": DEFINE, "within": span},           # two shapes
               "three": {"pattern": "x y y", "define": DEFINE, "within": span // 2}}
    return (lambda: SharedPatterns(key="key", queries=queries), "_runs",
            [(None, b) for b in _batches(_marked(n, k))])


def ep_over(n: int, k: int):
    from pescheduler.operators.ep_over import OverLanes

    span = _window(n, k)
    lanes = {span: {"both": AGGS}, span // 2: {"count": {"n": ("count", None)}}}
    return lambda: OverLanes(key="key", lanes=lanes), "_windows", [(None, b) for b in _batches(_events(n, k))]


def changelog_aggregate(n: int, k: int):
    from pescheduler.operators.changelog_aggregate import ChangelogAggregate

    rnd = random.Random(6)
    rows, changes = {}, []                         # half the events update their key's row: a retraction first
    for i, key in enumerate(key_stream(n, k, 6)):
        row = {"key": key, "v": i % 100}
        if key in rows and rnd.random() < 0.5:
            changes.append({"sign": -1, "key": key, "row": rows[key]})
        changes.append({"sign": 1, "key": key, "row": row})
        rows[key] = row
    aggregates = {"total": ("sum", "v"), "n": ("count", None), "top": ("max", "v")}
    return (lambda: ChangelogAggregate(by="key", aggregates=aggregates), "_groups",
            [(None, b) for b in _batches(changes)])


OPERATORS: dict[str, Callable] = {"count_window": count_window, "session_window": session_window,
                                  "latest": latest, "process": process, "join_asof": join_asof,
                                  "lookup": lookup, "join": join, "over_window": over_window,
                                  "pattern": pattern, "ep_patterns": ep_patterns, "ep_over": ep_over,
                                  "changelog_aggregate": changelog_aggregate}


def _batches(items: list) -> list[list]:
    return [items[b:b + BATCH] for b in range(0, len(items), BATCH)]


def run_once(make: Callable, attr: str, batches: list, backend: str,
             clock: Callable[[], float] = time.perf_counter) -> tuple[float, tuple[int, int]]:
    """Seconds (of ``clock``) to run ``batches`` through a fresh operator on ``backend``, and (keys
    held at the end, tuples emitted): the same for every backend."""
    op = make()
    op.open(OperatorContext(op.name, pe_id="bench", key_field="key",
                            extra={"state": "disk" if backend == "disk" else "memory"}))
    if backend == "dict":
        setattr(op, attr, DictState())
    state = getattr(op, attr)
    out, view, marks, wm, emitted = Emitter(), None, [], 0, 0
    for _, batch in batches:                        # the watermark after each batch: the largest ts seen
        wm = max([wm] + [t["ts"] for t in batch if "ts" in t])
        marks.append(wm - 10)
    t0 = clock()
    for i, (input_index, batch) in enumerate(batches):
        gc.disable()                                # as the worker's chain runs a batch (emit_from)
        try:
            if input_index is None:
                op.process(batch, out)
            else:
                op.process_input(input_index, batch, out)
        finally:
            gc.enable()
        op.on_watermark(marks[i], out)              # a watermark: the collector not paused
        if view is not None:
            view.release()                          # a checkpoint's files are written: let go
            view = None
        if backend != "dict" and i % CHECKPOINT == CHECKPOINT - 1:
            view = state.snapshot()                 # live during the next batch, or not at all
            if backend in ("memory", "disk"):
                view.release()
                view = None
        emitted += len(out)
        out.clear()
    elapsed = clock() - t0
    if view is not None:
        view.release()
    held = len(state) if backend != "disk" else sum(1 for _ in state.entries())
    if backend == "disk":
        state.close()                               # its files go now, not at the collection
    return elapsed, (held, emitted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1000,10000,100000", help="comma-separated K")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default=",".join(OPERATORS), help="comma-separated operators")
    parser.add_argument("--quick", action="store_true", help="K = 1000, one repetition, a short stream")
    parser.add_argument("--cpu", action="store_true", help="CPU time of the thread, not the time passed")
    parser.add_argument("--disk", action="store_true",
                        help=f"also the disk backend (cache {DISK_CACHE}, a temporary directory): disk ms, disk/memory")
    args = parser.parse_args()
    if args.disk:
        import tempfile

        import dask.config

        root = tempfile.mkdtemp(prefix="keyed-operators-")
        atexit.register(shutil.rmtree, root, True)
        dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": DISK_CACHE})
    sizes = [1000] if args.quick else [int(x) for x in args.keys.split(",")]
    repeat = 1 if args.quick else args.repeat
    clock = time.thread_time if args.cpu else time.perf_counter
    print(f"load average {os.getloadavg()[0]:.1f} (figures (L) on a loaded machine: compare ratios); "
          f"{'CPU time' if args.cpu else 'time passed'}")
    print(f"{'K':>7} {'operator':19} {'tuples':>7} {'dict ms':>8} {'memory ms':>10} {'live ms':>8} "
          f"{'memory/dict':>12} {'live/dict':>10} {'keys held':>10}"
          + (f" {'disk ms':>9} {'disk/memory':>12}" if args.disk else ""))
    for k in sizes:
        n = 5000 if args.quick else max(100_000, 2 * k)
        for name in args.only.split(","):
            make, attr, batches = OPERATORS[name](n, k)
            best = {"dict": float("inf"), "memory": float("inf"), "live": float("inf")}
            if args.disk:
                best["disk"] = float("inf")
            runs = len(best)
            held = {}
            for backend in best:                    # untimed: imports (numpy at a fold), first allocations
                run_once(make, attr, batches[:CHECKPOINT + 2], backend)
            for r in range(repeat):                 # interleaved, the order rotating
                for backend in list(best)[r % runs:] + list(best)[:r % runs]:
                    elapsed, held[backend] = run_once(make, attr, batches, backend, clock)
                    best[backend] = min(best[backend], elapsed)
            if len(set(held.values())) != 1:
                sys.exit(f"{name}: the runs differ in (keys held at the end, tuples emitted): {held}")
            print(f"{k:7d} {name:19} {sum(len(b) for _, b in batches):7d} {best['dict'] * 1e3:8.1f} "
                  f"{best['memory'] * 1e3:10.1f} {best['live'] * 1e3:8.1f} {best['dict'] / best['memory']:12.2f} "
                  f"{best['dict'] / best['live']:10.2f} {held['memory'][0]:10d}"
                  + (f" {best['disk'] * 1e3:9.1f} {best['memory'] / best['disk']:12.2f}" if args.disk else ""))
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

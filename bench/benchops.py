"""Operators used only by benchmarks (loaded with ``plugins=["benchops"]``; bench/ is on sys.path).

``replay`` pre-generates distinct connected-car events in ``open()`` so that a
channel benchmark measures the channel, not the generator; ``throughput``
records when the first and last tuples arrived (and per-batch latency when
tuples carry a ``sent`` stamp) and writes them to ``path`` at end of stream.

For the reconfiguration benchmark: ``counter`` numbers every tuple it emits
(bounded or unbounded, its position moves with it), ``keyed_sum`` is a keyed
running sum (state that moves on fuse/split/move), and ``arrivals`` records
when each batch arrived and which numbers it has seen, so the benchmark can
draw throughput over time and prove every number arrived exactly once.

``every_key`` gives each of K keys one tuple and holds the stream open: keyed state of K
keys for bench/state.py. ``churn``, ``stamps``, ``latest_in_dicts`` and ``latest_in_rocksdb``: bench/state.py's
table (issue 30); ``latest_in_rocksdb`` is also bench/fill.py's ``rocksdb``.
"""

from __future__ import annotations

import json
import pickle
import time
from array import array
from bisect import bisect_right
from collections import deque
from dataclasses import replace
from itertools import repeat
from operator import itemgetter

import pescheduler
from pescheduler import Operator, Parallelism, Sink, Source
from pescheduler.state import KeyedOperator, keyed_state


_TS = itemgetter("ts")


class Replay(Source):
    name = "replay"

    def __init__(self, events: int = 1_000_000, stamp: bool = False, columnar: bool = False, **kw) -> None:
        super().__init__(ts_field=None, **kw)
        self.events, self.stamp, self.columnar, self.i = events, stamp, columnar, 0

    def open(self, context) -> None:
        super().open(context)
        self.pool = self.make_pool(min(self.events, 200_000), self.columnar)

    @staticmethod
    def make_pool(events: int, columnar: bool) -> list:
        """Distinct events to replay: dicts, or RecordBatches of 65,536 rows (bench/channel.py's
        raw socket loop sends the very same)."""
        from pescheduler.operators.sources import GeneratorSource

        gen = GeneratorSource(events=events, keys=10_000, seed=1, columnar=columnar)
        pool = []
        while (batch := gen.read(10_000)) is not None:
            pool.append(batch) if columnar else pool.extend(batch)
        return pool

    def read(self, n):
        if self.i >= self.events:
            return None
        if self.columnar:                   # whole Arrow batches (65,536 rows), round robin
            batch = self.pool[(self.i // 65_536) % len(self.pool)]
            self.i += len(batch)
            return batch
        start = self.i % len(self.pool)
        batch = self.pool[start:start + min(n, self.events - self.i)]
        self.i += len(batch)
        if self.stamp:
            now = time.monotonic()
            batch = [{**t, "sent": now} for t in batch]
        return batch


_PREMADE: dict = {}


def premade_events(events: int, columnar: bool, keys: int = 10_000, seed: int = 7,
                   plain_keys: bool = False, rows: int = 65_536) -> list:
    """The generator's events made once per process: lists of dicts, or RecordBatches of ``rows`` rows
    (``plain_keys``: the car column as plain strings, not over the generator's one dictionary, as a
    key column arrives from most sources: every batch then brings its own keys to map). The events
    are the same whatever ``rows`` is (the generator's sequence does not depend on batch sizes)."""
    spec = (events, columnar, keys, seed, rows)
    if spec not in _PREMADE:
        from pescheduler.operators.sources import GeneratorSource

        gen = GeneratorSource(events=events, keys=keys, seed=seed, columnar=columnar, columnar_rows=rows)
        _PREMADE.clear()
        _PREMADE[spec] = list(iter(lambda: gen.read(1000), None))
    if plain_keys and (spec, "plain") not in _PREMADE:
        _PREMADE[spec, "plain"] = [b.set_column(0, "car", b.column(0).cast(b.column(0).type.value_type))
                                   for b in _PREMADE[spec]]
    return _PREMADE[spec, "plain"] if plain_keys else _PREMADE[spec]


class Premade(Source):
    """The connected-car events, made in ``open()`` (not timed); writes the wall clock and the process's
    CPU time at the first read to ``start_path`` so the benchmark times source start -> sink end across
    processes (:class:`Collect` notes both at the end)."""

    name = "premade"

    def __init__(self, events: int, start_path: str, columnar: bool = False, plain_keys: bool = False,
                 batch_rows: int = 65_536, **kw) -> None:
        super().__init__(**kw)
        self.events, self.start_path, self.columnar, self.i = events, start_path, columnar, 0
        self.plain_keys, self.batch_rows = plain_keys, batch_rows      # batch_rows: the Arrow batches' size

    def open(self, context) -> None:
        super().open(context)
        self.batches = premade_events(self.events, self.columnar, plain_keys=self.plain_keys, rows=self.batch_rows)

    def read(self, n):
        if self.i == 0:
            with open(self.start_path, "w") as f:      # the wall clock, and this process's CPU time
                f.write(f"{time.time()!r} {time.process_time()!r}")
        if self.i >= len(self.batches):
            return None
        self.i += 1
        return self.batches[self.i - 1]


class Collect(Sink):
    """Keeps every batch (rows or Arrow); at the end notes the wall clock and the process's CPU time,
    then writes the rows."""

    name = "collect_batches"     # not "collect": tests/support_ops.py has that one, and bench/overload.py loads both
    columnar = True

    def __init__(self, path: str) -> None:
        self.path, self.batches = path, []

    def process(self, batch, emit):
        self.batches.append(batch)

    def flush(self, emit):
        end, end_cpu = time.time(), time.process_time()
        import pickle

        rows = [r for b in self.batches for r in (b if isinstance(b, list) else b.to_pylist())]
        with open(self.path, "wb") as f:
            pickle.dump({"end": end, "end_cpu": end_cpu, "rows": rows}, f)


class Throughput(Sink):
    name = "throughput"
    columnar = True         # Arrow batches are counted whole

    def __init__(self, path: str) -> None:
        self.path = path
        self.first = self.last = None
        self.count = self.ts_sum = 0        # what arrived, checked by bench/channel.py
        self.latencies: list[float] = []

    def _arrived(self, batch) -> float:
        """Count ``batch`` in; its arrival time."""
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now
        self.count += len(batch)
        return now

    def process(self, batch, emit):
        now = self._arrived(batch)
        if isinstance(batch, list):
            self.ts_sum += sum(map(_TS, batch))
        else:
            import pyarrow.compute as pc

            self.ts_sum += pc.sum(batch.column("ts")).as_py()
        if isinstance(batch, list) and batch and "sent" in batch[0]:
            self.latencies.append(now - batch[0]["sent"])

    def flush(self, emit):
        with open(self.path, "w") as f:
            json.dump({"first": self.first, "last": self.last, "count": self.count,
                       "ts_sum": self.ts_sum, "latencies": self.latencies}, f)


class Counter(Source):
    """``{"n": i, "key": i % keys}`` for i = 0, 1, 2, ... (``count=None``: until drained)."""

    name = "counter"

    def __init__(self, count: int | None = None, keys: int = 100, **kw) -> None:
        super().__init__(ts_field=None, **kw)
        self.count, self.keys, self.i = count, keys, 0

    def read(self, n):
        i, keys = self.i, self.keys
        hi = i + n if self.count is None else min(self.count, i + n)
        if i >= hi:
            return None
        self.i = hi
        return [{"n": j, "key": j % keys} for j in range(i, hi)]

    def snapshot(self):
        return self.i

    def restore(self, state):
        self.i = state


class KeyedSum(Operator):
    """Keyed running sum of ``field``: emits ``{"n", "key", "sum"}`` (state moves on reconfiguration)."""

    name = "keyed_sum"
    parallelism = Parallelism.KEYED

    def __init__(self, field: str = "n", keep: tuple = ()) -> None:
        self.field, self.keep = field, tuple(keep)       # keep: input fields carried to the output
        self.sums: dict = {}

    def process(self, batch, emit):
        key, field, sums, keep = self.context.key_field, self.field, self.sums, self.keep
        out = []
        for t in batch:
            k = t[key]
            s = sums[k] = sums.get(k, 0) + t[field]
            r = {"n": t["n"], "key": k, "sum": s}
            if keep:
                r.update((f, t[f]) for f in keep)
            out.append(r)
        emit.many(out)

    def snapshot(self):
        return dict(self.sums)

    def restore(self, state):
        self.sums = dict(state)

    def split_state(self, state, owns):
        return {k: v for k, v in state.items() if owns(k)}

    def merge_states(self, states):
        return {k: v for state in states for k, v in state.items()}


class Arrivals(Sink):
    """Per batch: arrival time (``time.time()``) and size; which numbers (``field``) were seen.

    Numbers seen are kept as sorted disjoint runs ``[start, end)``, so an
    in-order stream costs one comparison per batch and the state stays small
    when it moves; a number seen again is counted as a duplicate, a batch that
    does not continue the last run as ``reordered``. Without ``keys`` a
    reordered batch is out of order. With ``keys`` (``counter``'s numbering:
    number ``n`` is key ``n % keys``, its key's next number ``n + keys``) the
    promise is per-key order (docs/state.md: a moved key group's tuples wait for
    its state while other groups go on), so a number is out of order when its
    key's next number was seen before it; and the running ``sum`` of each
    batch's last tuple is checked against the closed form for ``counter`` +
    ``keyed_sum`` (operator state that moved with a PE must be exact).
    Everything is written to ``path`` as JSON at end of stream.
    """

    name = "arrivals"

    def __init__(self, path: str, field: str = "n", keys: int | None = None) -> None:
        self.path, self.field, self.keys = path, field, keys
        self.times, self.sizes = array("d"), array("q")
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.duplicates = self.out_of_order = self.reordered = self.bad_sums = self.count = 0

    def process(self, batch, emit):
        if not batch:
            return
        self.times.append(time.time())
        self.sizes.append(len(batch))
        self.count += len(batch)
        f = self.field
        ns = [t[f] for t in batch]
        a = ns[0]
        if self.ends and a == self.ends[-1] and ns == list(range(a, a + len(ns))):
            self.ends[-1] = a + len(ns)                       # the common case: in order, nothing missing
        else:
            reordered = bool(self.ends)
            self.reordered += reordered
            if not self.keys:
                self.out_of_order += reordered
            for n in ns:
                if self.keys and self._seen(n + self.keys):
                    self.out_of_order += 1
                self._add(n)
        if self.keys:
            last = batch[-1]
            k, n = last["key"], last["n"]
            j = (n - k) // self.keys                          # n = k + j * keys: the (j+1)-th tuple of key k
            if last["sum"] != (j + 1) * k + self.keys * j * (j + 1) // 2:
                self.bad_sums += 1

    def _seen(self, n: int) -> bool:
        i = bisect_right(self.starts, n) - 1
        return i >= 0 and n < self.ends[i]

    def _add(self, n: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, n) - 1
        if i >= 0 and n < ends[i]:
            self.duplicates += 1
        elif i >= 0 and n == ends[i]:
            ends[i] += 1
            if i + 1 < len(starts) and starts[i + 1] == ends[i]:
                ends[i] = ends.pop(i + 1)
                starts.pop(i + 1)
        elif i + 1 < len(starts) and starts[i + 1] == n + 1:
            starts[i + 1] = n
        else:
            starts.insert(i + 1, n)
            ends.insert(i + 1, n + 1)

    def snapshot(self):
        return {k: getattr(self, k) for k in ("times", "sizes", "starts", "ends", "duplicates",
                                              "out_of_order", "reordered", "bad_sums", "count")}

    def restore(self, state):
        for k, v in state.items():
            setattr(self, k, v)

    def flush(self, emit):
        with open(self.path, "w") as f:
            json.dump({"times": self.times.tolist(), "sizes": self.sizes.tolist(),
                       "runs": list(zip(self.starts, self.ends)), "duplicates": self.duplicates,
                       "out_of_order": self.out_of_order, "reordered": self.reordered, "bad_sums": self.bad_sums,
                       "count": self.count}, f)


class Schedule(Source):
    """``{"n", "key", "ts": n, "sent": wall time}`` paced by a schedule of ``(seconds, tuples/s)``
    phases, from the first read on; ends after the last phase (or when drained). Position and
    start time move with it, so a moved source keeps to the schedule."""

    name = "schedule"

    def __init__(self, phases: list, keys: int = 100, **kw) -> None:
        super().__init__(ts_field="ts", **kw)
        self.phases, self.keys, self.i, self.t0 = [tuple(p) for p in phases], keys, 0, None

    def due(self, elapsed: float) -> float | None:
        """Tuples the schedule has offered after ``elapsed`` seconds (None: past its end)."""
        total, t = 0.0, 0.0
        for seconds, rate in self.phases:
            if elapsed < t + seconds:
                return total + (elapsed - t) * rate
            total, t = total + seconds * rate, t + seconds
        return None

    def read(self, n):
        now = time.time()
        if self.t0 is None:
            self.t0 = now
        due = self.due(now - self.t0)
        if due is None:
            return None
        i, keys = self.i, self.keys
        hi = min(i + n, int(due))
        self.i = max(i, hi)
        return [{"n": j, "key": j % keys, "ts": j, "sent": now} for j in range(i, hi)]

    def lag(self):
        """Tuples the schedule has offered but the source has not emitted yet (held back by
        backpressure): its backlog, as a broker source's lag is. The monitor turns its change into
        ``lag_per_s``, so the ``rate`` policy reads the offered rate as output plus lag growth
        instead of guessing it from the time blocked."""
        due = self.due(time.time() - self.t0) if self.t0 is not None else 0.0
        return {"schedule": max(0, int(due) - self.i) if due is not None else 0}

    def snapshot(self):
        return (self.i, self.t0)

    def restore(self, state):
        self.i, self.t0 = state


class KeyedCheck(Sink):
    """Checks a ``schedule`` -> ``keyed_sum(keep=("sent",))`` stream tuple by tuple: numbers seen twice, per-key
    order (each key's numbers must rise), running sums (closed form), and per batch the age of
    its oldest tuple with the arrival time. Written to ``path`` as JSON at end of stream."""

    name = "keyed_check"

    def __init__(self, path: str, keys: int = 100) -> None:
        self.path, self.keys = path, keys
        self.seen = bytearray()
        self.last: dict = {}
        self.duplicates = self.order = self.bad_sums = self.count = 0
        self.arrived, self.latency = array("d"), array("d")

    def process(self, batch, emit):
        if not batch:
            return
        now = time.time()
        self.arrived.append(now)
        self.latency.append(now - min(t["sent"] for t in batch))
        seen, last, keys = self.seen, self.last, self.keys
        for t in batch:
            n, k = t["n"], t["key"]
            if n >= len(seen):
                seen.extend(bytes(max(n + 1 - len(seen), len(seen))))
            if seen[n]:
                self.duplicates += 1
            seen[n] = 1
            if n <= last.get(k, -1):
                self.order += 1
            last[k] = n
            j = (n - k) // keys
            if t["sum"] != (j + 1) * k + keys * j * (j + 1) // 2:
                self.bad_sums += 1
        self.count += len(batch)

    def snapshot(self):
        return {k: getattr(self, k) for k in ("seen", "last", "duplicates", "order", "bad_sums", "count",
                                              "arrived", "latency")}

    def restore(self, state):
        for k, v in state.items():
            setattr(self, k, v)

    def flush(self, emit):
        first_gap = self.seen.find(0)
        with open(self.path, "w") as f:
            json.dump({"count": self.count, "distinct": sum(self.seen), "max": len(self.seen) - 1,
                       "first_missing": first_gap, "duplicates": self.duplicates, "order": self.order,
                       "bad_sums": self.bad_sums, "arrived": self.arrived.tolist(),
                       "latency": self.latency.tolist()}, f)


class Latency(Throughput):
    """Event-created -> sink wall-clock latency of every ``every``-th tuple (``sent``: ``replay``'s
    stamp, ``time.monotonic`` of the host both processes share), and the arrival span, pickled to
    ``path`` at end of stream (bench/latency.py)."""

    name = "latency"
    columnar = False

    def __init__(self, path: str, every: int = 1) -> None:
        super().__init__(path)
        self.every = every
        self.latencies = array("d")

    def process(self, batch, emit):
        now = self._arrived(batch)
        self.latencies.extend(now - t["sent"] for t in batch[::self.every])

    def flush(self, emit):
        import pickle

        with open(self.path, "wb") as f:
            pickle.dump({"first": self.first, "last": self.last, "count": self.count,
                         "latencies": self.latencies.tobytes()}, f)


class Burst(Operator):
    """Passes tuples on; once ``after`` have passed, emits ``keys`` results at once, each stamped
    with the moment of the fire (``sent``), as a window firing ``keys`` keys does (the results are
    made in ``open()``, so the fire itself costs only their stamps): bench/latency.py's fire part."""

    name = "burst"

    def __init__(self, keys: int, after: int = 1000) -> None:
        self.keys, self.after, self.seen = keys, after, 0

    def open(self, context) -> None:
        self.results = [{"key": i, "sent": 0.0} for i in range(self.keys)]

    def process(self, batch, emit):
        emit.many(batch)
        before, self.seen = self.seen, self.seen + len(batch)
        if before < self.after <= self.seen:
            now = time.monotonic()
            for r in self.results:
                r["sent"] = now
            emit.many(self.results)


class EveryKey(Source):
    """``{"key": i, "ts": i, "v": 1}`` once for each of ``keys`` keys, then nothing until the file
    ``until`` exists, then the end: keyed state of ``keys`` keys held while a benchmark works on
    it (bench/state.py). ``arrow``: each read one Arrow RecordBatch of those rows. ``then``: after
    the fill, that many tuples a second go on until then, 90 % of them over the ``hot`` keys
    0..hot-1 (the rest over every key; ``hot`` 0: every tuple over every key), so a move's groups
    have tuples waiting for them, a hot key's most (bench/state.py's ``--hot``)."""

    name = "every_key"

    def __init__(self, keys: int = 1000, until: str = "", arrow: bool = False, then: float = 0.0, hot: int = 0,
                 seed: int = 7, **kw) -> None:
        super().__init__(**kw)              # (not ``rate``: a Source's ``rate`` paces every read, the fill's too)
        self.keys, self.until, self.arrow, self.i = keys, until, arrow, 0
        self.then, self.hot, self.seed, self.sent, self.filled_at = then, hot, seed, 0, None

    def read(self, n):
        import os

        if self.i >= self.keys:
            if os.path.exists(self.until):
                return None
            return self._later(n) if self.then else []
        hi = min(self.keys, self.i + n)
        if self.arrow:
            import pyarrow as pa

            out = pa.RecordBatch.from_pydict({"key": range(self.i, hi), "ts": range(self.i, hi), "v": [1] * (hi - self.i)})
        else:
            out = [{"key": i, "ts": i, "v": 1} for i in range(self.i, hi)]
        self.i = hi
        return out

    def _later(self, n: int) -> list:
        """The tuples come due since the fill (``then`` a second), at most ``n``."""
        import random

        if self.filled_at is None:
            self.filled_at = time.monotonic()
        due = min(n, int((time.monotonic() - self.filled_at) * self.then) - self.sent)
        if due <= 0:
            return []
        draw = random.Random(self.seed * 1_000_003 + self.sent)
        keys = [draw.randrange(self.hot) if self.hot and draw.random() < 0.9 else draw.randrange(self.keys)
                for _ in range(due)]
        ts = self.keys + self.sent
        self.sent += due
        return [{"key": k, "ts": ts + j, "v": 1} for j, k in enumerate(keys)]

    def position(self):                  # a checkpoint's record of it (bench/state.py checkpoints)
        return {"i": self.i, "sent": self.sent}

    def seek(self, position):
        self.i, self.sent = position["i"], position.get("sent", 0)


class Churn(Source):
    """Issue 30's workload for bench/state.py's table: ``keys`` inserts (the fill), then per second
    ``changes`` updates of random keys (1 % of the keys per 1 s checkpoint interval) and ``ticks``
    updates of one more key (``-1``), so that the operator beside them emits steadily and the gaps
    between its outputs show a stall; until the file ``until`` exists. Changes for ``latest``
    (``{"op", "id", "after", "ts"}``); ``position``/``seek`` let a restore go on without a refill.
    After the fill it gives what came due since its last read, one read a poll interval: the
    source's driver reads again at once after a read that gave something, and at 10^7 keys
    (20,000 changes a second) each read found a change or few, thousands of reads a second that
    kept the source's worker at 90 % of a core beside the state's (docs/state-log.md, session 65)."""

    name = "churn"
    poll_interval = 0.002               # an empty read is asked again soon: ticks 2 ms apart at most

    def __init__(self, keys: int, until: str, changes: float, ticks: float = 500, start: str = "", **kw) -> None:
        super().__init__(**kw)
        self.keys, self.until, self.changes, self.ticks, self.start = keys, until, changes, ticks, start
        self.i = self.sent_changes = self.sent_ticks = 0
        self.t0: float | None = None    # when the fill ended (monotonic)
        self._read_at = 0.0             # the last read of the changes (monotonic)

    def read(self, n):
        import os
        import random

        if self.i == 0 and self.start:  # the fill's start (wall clock), for its rate
            with open(self.start, "w") as f:
                f.write(repr(time.time()))
        if self.i < self.keys:
            hi = min(self.keys, self.i + n)
            out = [{"op": "insert", "id": i, "after": {"v": 1}, "ts": i} for i in range(self.i, hi)]
            self.i = hi
            return out
        if os.path.exists(self.until):
            return None
        now = time.monotonic()
        if now - self._read_at < self.poll_interval:
            return []                   # what came due in a poll interval, not a change or two a read
        self._read_at = now
        if self.t0 is None:             # the fill's end, or a restore: go on at the pace already reached
            self.t0 = now - max(self.sent_changes / max(self.changes, 1e-9), self.sent_ticks / self.ticks)
        changes = min(n, int((now - self.t0) * self.changes) - self.sent_changes)
        ticks = min(n - changes, int((now - self.t0) * self.ticks) - self.sent_ticks)
        rng = random.Random(self.sent_changes)
        out = [{"op": "update", "id": rng.randrange(self.keys), "after": {"v": self.sent_changes + j},
                "ts": self.keys + self.sent_changes + j} for j in range(max(0, changes))]
        out += [{"op": "update", "id": -1, "after": {"v": self.sent_ticks + j}, "ts": self.keys}
                for j in range(max(0, ticks))]
        self.sent_changes += max(0, changes)
        self.sent_ticks += max(0, ticks)
        return out

    def position(self):
        return {"i": self.i, "changes": self.sent_changes, "ticks": self.sent_ticks}

    def seek(self, position) -> None:
        self.i, self.sent_changes, self.sent_ticks = position["i"], position["changes"], position["ticks"]
        self.t0 = None


class Stamps(Sink):
    """Appends ``<time.time()> <batch size>`` per batch to ``path`` as it arrives (flushed, so the
    lines survive a SIGKILL): bench/state.py reads the gaps between outputs and the fill's rate."""

    name = "stamps"

    def __init__(self, path: str) -> None:
        self.path, self.file = path, None

    def process(self, batch, emit):
        if batch:
            if self.file is None:
                self.file = open(self.path, "a", buffering=1)
            self.file.write(f"{time.time():.6f} {len(batch)}\n")


class LatestInDicts(Operator):
    """``latest`` with its rows in one plain dict, as KEYED operators kept state before the
    backends (snapshot: the whole dict copied at the barrier): the table's throughput baseline."""

    name = "latest_in_dicts"
    parallelism = Parallelism.KEYED

    def __init__(self, key: str = "id") -> None:
        self.key, self.rows = key, {}

    def process(self, batch, emit):
        rows, key = self.rows, self.key
        for change in batch:
            k = change[key]
            previous = rows.get(k)
            rows[k] = change["after"]
            emit({"op": "upsert", key: k, "row": change["after"], "previous": previous})

    def snapshot(self):
        return {"rows": dict(self.rows)}

    def restore(self, state):
        self.rows = dict(state["rows"])


class LatestInRocksDB(Operator):
    """``latest`` as the raw client loop of a ``disk`` store: the strongest baseline of the ``disk``
    backend's write path (bench/state.py's table, bench/fill.py's ``rocksdb``). A store opened as
    ``disk`` opens one (``keyed_state``: its cache, memtables, filters, no WAL) and the backend's key
    encoding (a key's group byte, tag and digits: int keys, ``churn``'s ids); per batch the keys
    grouped and encoded, the rows pickled, sorted and put into one write batch, written. Nothing
    else: no write-back buffer, no changed keys kept for a checkpoint, no "may be stored" filter,
    and an insert's previous row is not read (a fill's keys are new: a read would find nothing); an
    update's are, in one multi-get. Its rows are not checkpointed (its snapshot is empty): never
    rescaled or restored, it is what a fill through this binding costs at the least."""

    name = "latest_in_rocksdb"
    parallelism = Parallelism.KEYED

    def __init__(self, key: str = "id") -> None:
        self.key, self._state = key, None

    def open(self, context):
        super().open(context)
        # a disk store whatever the deployment's backend (its rows are its own, never the backend's)
        self._state = keyed_state(replace(context, extra={**context.extra, "state": "disk"}), "rows")

    def process(self, batch, emit):
        from rocksdict import WriteBatch

        from pescheduler.state.disk import _INT_KEY, _PICKLE
        from pescheduler.state.groups import key_groups

        key, db = self.key, self._state._db
        keys = [change[key] for change in batch]
        encoded = list(map(_INT_KEY.__mod__, zip(key_groups(keys), keys)))
        previous = repeat(None)
        if any(change["op"] != "insert" for change in batch):      # the rows replaced, as latest reads them
            previous = [None if raw is None else pickle.loads(raw) for raw in db.get(encoded)]
        rows = dict(zip(encoded, map(pickle.dumps, [change["after"] for change in batch], repeat(_PICKLE))))
        order, written = sorted(rows), WriteBatch(raw_mode=True)
        deque(map(written.put, order, map(rows.__getitem__, order)), maxlen=0)
        db.write(written)
        for k, change, before in zip(keys, batch, previous):
            emit({"op": "upsert", key: k, "row": change["after"], "previous": before})

    def held(self) -> int:
        """Keys in the store (counted, not estimated)."""
        return sum(1 for _ in self._state._db.keys())

    def snapshot(self):
        return {}

    def restore(self, state):
        pass


class RunningCount(KeyedOperator):
    """How many tuples each key has sent so far, written as docs/state.md shows an operator of
    your own: its keyed state named, nothing else (bench/rescale_ops.py's ``count``)."""

    name = "running_count"
    keyed_states = ("counts",)

    def process(self, batch, emit):
        counts = self.counts
        for t in batch:
            n = counts.get(t["key"], 0) + 1
            counts.put(t["key"], n)
            emit({"key": t["key"], "count": n})


class RunningCountWhole(Operator):
    """:class:`RunningCount` as docs/state.md showed it before ``KeyedOperator``: the same keyed
    state with ``snapshot``, ``restore``, ``split_state`` and ``merge_states`` written, no
    ``export_groups``/``import_groups`` (bench/rescale_ops.py's ``count_whole``: a rescale takes
    its whole state apart)."""

    name = "running_count_whole"
    parallelism = Parallelism.KEYED

    def __init__(self) -> None:
        from pescheduler.state import MemoryState

        self.counts = MemoryState()

    def open(self, context) -> None:
        from pescheduler.state import adopt

        super().open(context)
        self.counts = adopt(context, self.counts)

    process = RunningCount.process

    def snapshot(self):
        from pescheduler.state.groups import snapshot_groups

        return snapshot_groups(self.counts)

    def restore(self, state):
        from pescheduler.state.groups import restore_groups

        restore_groups(self.counts, state)

    def split_state(self, state, owns):
        from pescheduler.state.groups import split_groups

        return split_groups(state, owns)

    def merge_states(self, states):
        from pescheduler.state.groups import merge_groups

        return merge_groups(states)


@pescheduler.hookimpl
def pescheduler_operators():
    return [Replay, Throughput, Counter, KeyedSum, Arrivals, Premade, Collect, Schedule, KeyedCheck, Latency,
            EveryKey, Burst, Churn, Stamps, LatestInDicts, LatestInRocksDB, RunningCount, RunningCountWhole]

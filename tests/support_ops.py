"""Operators used only by tests, loaded with ``--plugin support_ops`` (tests/ is on sys.path)."""

from __future__ import annotations

import random
import threading

import pescheduler
from pescheduler import Operator, Parallelism, Sink, Source
from pescheduler.aggregates import Aggregate
from pescheduler.state import KeyedOperator


class Numbers(Source):
    """``{"n": i, "key": i % keys, "ts": i * step}`` for i in [0, count), with ``"pad"``: ``pad``
    random bytes as hex (the same for the same i) when ``pad`` is set: state large in bytes without
    the cost of as many more tuples.

    With ``hold_at`` and ``release`` (a file path) it emits nothing past ``hold_at`` until that
    file exists: a test that must act while the stream still runs (borrow a host, move a PE onto
    it) lets it finish when done, however long its steps took on a loaded machine, and still
    checks the whole stream exactly. Several holds: ``hold_at`` and ``release`` as sequences, each
    position held until its own file exists (a Replicate's copy gets tuples only once the first is
    let go after it: at 20,000 tuples/s one hold, reached in 2 s, came before a loaded machine's
    Replicate, and the copy never counted)."""

    name = "numbers"

    def __init__(self, count: int = 1000, keys: int = 10, step: int = 1, hold_at: int | tuple | None = None,
                 release: str | tuple | None = None, pad: int = 0, **kw) -> None:
        super().__init__(**kw)
        self.count, self.keys, self.step, self.i, self.pad = count, keys, step, 0, pad
        self.hold_at, self.release = hold_at, release

    def _holds(self) -> list[int]:
        """The positions still held (their file not there yet)."""
        import os

        if self.hold_at is None:
            return []
        at, files = ((self.hold_at, self.release) if isinstance(self.hold_at, (list, tuple))
                     else ((self.hold_at,), (self.release,)))
        return [a for a, f in zip(at, files) if not os.path.exists(f)]

    def read(self, n):
        if self.i >= self.count:
            return None
        holds = self._holds()
        if any(self.i >= a for a in holds):
            return []
        hi = min(self.count, self.i + n, *holds)
        out = [{"n": i, "key": i % self.keys, "ts": i * self.step} for i in range(self.i, hi)]
        if self.pad:
            for t in out:
                t["pad"] = random.Random(t["n"]).randbytes(self.pad).hex()
        self.i = hi
        return out

    def snapshot(self):
        return self.i

    def restore(self, state):
        self.i = state

    def position(self):
        return {"i": self.i}

    def seek(self, position):
        self.i = position["i"]


class FailingNumbers(Numbers):
    """:class:`Numbers` whose ``read`` raises once at each position of ``fail_at`` (a marker file
    per position in ``marks`` remembers it across the restores it causes): a PE that fails again
    and again, far apart, as a broker that drops out now and then makes one fail."""

    name = "failing_numbers"

    def __init__(self, fail_at: tuple = (), marks: str = "", **kw) -> None:
        super().__init__(**kw)
        self.fail_at, self.marks = tuple(fail_at), marks

    def read(self, n):
        import os

        holds = self._holds()               # a hold comes first: nothing past it fails while it holds
        if any(self.i >= a for a in holds):
            return []
        n = min(n, *(a - self.i for a in holds)) if holds else n
        for at in self.fail_at:
            mark = os.path.join(self.marks, f"failed-at-{at}")
            if self.i <= at < self.i + n and not os.path.exists(mark):
                open(mark, "w").close()
                raise RuntimeError(f"injected failure of the source at {at}")
        return super().read(n)


class AbortingNumbers(Numbers):
    """:class:`Numbers` whose position fails once for each time the file ``flag`` is made (it is
    removed then): that checkpoint is aborted after the PEs downstream took their snapshots."""

    name = "aborting_numbers"

    def __init__(self, flag: str = "", **kw) -> None:
        super().__init__(**kw)
        self.flag = flag

    def position(self):
        import os

        if self.flag and os.path.exists(self.flag):
            os.remove(self.flag)
            raise RuntimeError("injected: this checkpoint's source position fails")
        return super().position()


class Tag(Operator):
    """Adds ``tag`` to each tuple (a stateless map with a parameter)."""

    name = "tag"

    def __init__(self, tag: str = "x") -> None:
        self.tag = tag

    def process(self, batch, emit):
        tag = self.tag
        emit.many([{**t, "tag": tag} for t in batch])


class RunningSum(Operator):
    """Keyed running sum: a stateful operator whose output depends on every earlier tuple."""

    name = "running_sum"
    parallelism = Parallelism.KEYED

    def __init__(self, field: str = "n", seconds: float = 0.0) -> None:
        # seconds: work modelled per tuple, an operator slower than its input (as slow_consumer: the
        # sleep is the work, not a wait for an event; there is none to await)
        self.field, self.seconds = field, seconds
        self.sums: dict = {}

    def process(self, batch, emit):
        if self.seconds:
            import time
            time.sleep(self.seconds * len(batch))
        key = self.context.key_field
        for t in batch:
            k = t[key]
            self.sums[k] = self.sums.get(k, 0) + t[self.field]
            emit({"key": k, "n": t["n"], "sum": self.sums[k]})

    def snapshot(self):
        return dict(self.sums)

    def restore(self, state):
        self.sums = dict(state)

    def split_state(self, state, owns):
        return {k: v for k, v in state.items() if owns(k)}

    def merge_states(self, states):
        return {k: v for s in states for k, v in s.items()}


class KeptSum(KeyedOperator):
    """:class:`RunningSum` as an operator of your own writes it with
    :class:`~pescheduler.state.KeyedOperator`: two keyed states (each key's sum and how many
    tuples it saw), nothing written for checkpoints or rescales."""

    name = "kept_sum"
    keyed_states = ("sums", "seen")

    def process(self, batch, emit):
        key, sums, seen = self.context.key_field, self.sums, self.seen
        for t in batch:
            k = t[key]
            total, n = sums.get(k, 0) + t["n"], seen.get(k, 0) + 1
            sums.put(k, total)
            seen.put(k, n)
            emit({"key": k, "n": t["n"], "sum": total, "seen": n})


class WindowCount(Operator):
    """MERGEABLE: tuples per tumbling event-time window of ``size`` ms, over all keys.

    Copies keep partial counts; ``take_partials`` hands over those of closed
    windows, ``absorb`` adds them in, so the original fires exact totals.
    """

    name = "window_count"
    parallelism = Parallelism.MERGEABLE

    def __init__(self, size: int = 1000) -> None:
        self.size = size
        self.counts: dict[int, int] = {}

    def process(self, batch, emit):
        size, counts = self.size, self.counts
        for t in batch:
            w = t["ts"] - t["ts"] % size
            counts[w] = counts.get(w, 0) + 1

    def _closed(self, watermark):
        return sorted(w for w in self.counts if watermark is None or w + self.size - 1 <= watermark)

    def on_watermark(self, watermark, emit):
        for w in self._closed(watermark):
            emit({"window_start": w, "count": self.counts.pop(w)})

    def take_partials(self, watermark):
        return [(w, self.counts.pop(w)) for w in self._closed(watermark)]

    def absorb(self, partials, emit):
        for w, c in partials:
            self.counts[w] = self.counts.get(w, 0) + c

    def snapshot(self):
        return dict(self.counts)

    def restore(self, state):
        self.counts = dict(state)


class HeldSnapshot(Operator):
    """Passes tuples on; while the file ``hold`` exists its snapshot (taken at a checkpoint's
    barrier) connects to the Unix socket ``release`` and waits for a byte from the test (at most
    120 s): a checkpoint a test can watch in flight, let go by an event, not a poll."""

    name = "held_snapshot"

    def __init__(self, hold: str = "", release: str = "") -> None:
        self.hold, self.release, self.seen = hold, release, 0

    def process(self, batch, emit):
        self.seen += len(batch)
        for t in batch:
            emit(t)

    def snapshot(self):
        import os
        import socket

        if self.hold and os.path.exists(self.hold):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(120)
                s.connect(self.release)
                s.recv(1)
        return self.seen

    def restore(self, state):
        self.seen = state


class Unpicklable(Operator):
    """Emits, for every n divisible by ``every``, a tuple holding a lock (cannot cross a channel)."""

    name = "unpicklable"

    def __init__(self, every: int = 100) -> None:
        self.every = every

    def process(self, batch, emit):
        every = self.every
        emit.many([{**t, "lock": threading.Lock()} if t["n"] % every == 0 else t for t in batch])


class Explode(Operator):
    """Raises inside ``process`` once it has seen ``after`` tuples: a PE-level failure."""

    name = "explode"
    parallelism = Parallelism.SINGLETON

    def __init__(self, after: int = 10) -> None:
        self.after, self.seen = after, 0

    def process(self, batch, emit):
        self.seen += len(batch)
        emit.many(batch)

    def on_watermark(self, wm, emit):
        if self.seen >= self.after:
            raise SystemError("explode: on purpose")  # not a per-tuple error


class Collect(Sink):
    """Keeps tuples in memory (for in-process chain tests only)."""

    name = "collect"

    def __init__(self) -> None:
        self.items: list = []

    def process(self, batch, emit):
        self.items.extend(batch)


SPREAD = Aggregate("spread", uses=("max", "min"), result=lambda hi, lo: hi - lo)


@pescheduler.hookimpl
def pescheduler_aggregates():
    return [SPREAD]


@pescheduler.hookimpl
def pescheduler_operators():
    return [Numbers, FailingNumbers, AbortingNumbers, Tag, RunningSum, KeptSum, WindowCount, HeldSnapshot, Unpicklable, Explode, Collect, OneShot, LapsesProcess]


def copy_holds(release, count: int, last: int = 1000) -> dict:
    """``numbers``' two holds for a test that copies an operator while the stream runs: half-way
    until :func:`replicated` is called, then ``last`` before the end until the file ``release``
    exists. With one hold, reached in seconds, a loaded machine's Replicate came after it and the
    copy never got a tuple."""
    return {"hold_at": (count // 2, count - last), "release": (f"{release}.replicated", str(release))}


def replicated(release) -> None:
    """The Replicate is applied: the stream held by :func:`copy_holds` goes on to its last hold."""
    open(f"{release}.replicated", "w").close()


def slow_consumer(seconds: float):
    """A map function that spends ``seconds`` on each tuple: a consumer slower than its source, so
    its input channels fill and its producers wait for credit (backpressure, and what queues behind
    it). The sleep is the work being modelled, not a wait for an event: there is none to await."""
    import time

    def slow(t):
        time.sleep(seconds)
        return t
    return slow


def committed_output(path) -> list:
    """What a ``jsonl`` sink made visible, in order (two-phase under checkpoints: only output a
    complete checkpoint covers is in the file)."""
    import json

    with open(path) as f:
        return [json.loads(line) for line in f]


class OneShot(Source):
    """A source that cannot rewind (like ``iterable`` over a generator): checkpoints refuse it."""

    name = "one_shot"

    def __init__(self, count: int = 10, **kw) -> None:
        super().__init__(**kw)
        self.left = iter(range(count))

    def read(self, n):
        from itertools import islice

        batch = [{"n": i, "ts": i} for i in islice(self.left, n)]
        return batch or None

    def position(self):
        from pescheduler.errors import NotReplayable

        raise NotReplayable("one_shot reads a one-shot iterator and cannot rewind; use `numbers` to checkpoint")


def count_sum_windows(count: int, keys: int, size_ms: int = 1000) -> list:
    """Plain-Python reference of ``numbers(count, keys, step=1)`` → ``key_by("key")`` → tumbling
    windows of ``size_ms`` (1 s) of ``c = count(n)`` and ``s = sum(n)``: sorted ``(key, window_start, c, s)``."""
    windows: dict = {}
    for i in range(count):
        c, s = windows.get((i % keys, i // size_ms * size_ms), (0, 0))
        windows[(i % keys, i // size_ms * size_ms)] = (c + 1, s + i)
    return sorted((k, w, c, s) for (k, w), (c, s) in windows.items())


def committed_windows(path) -> list:
    """The ``(key, window_start, c, s)`` a ``jsonl`` sink made visible, sorted."""
    return sorted((r["key"], r["window_start"], r["c"], r["s"]) for r in committed_output(path))


def last_checkpoint(dep) -> int:
    """The id of a deployment's newest complete checkpoint (0: none yet)."""
    done = dep.checkpoints()
    return done[-1]["id"] if done else 0


def rocksdb_stores(deployment: str) -> list[str]:
    """The RocksDB databases (directories with a ``CURRENT`` file) that workers on this machine hold
    open for ``deployment`` under the default state directory: proof that a ``state="disk"``
    deployment's keyed operators keep their state there, and a memory one's do not."""
    import glob
    import os

    from pescheduler.state.settings import machine_dir

    found = glob.glob(os.path.join(glob.escape(machine_dir(deployment)), "**", "CURRENT"), recursive=True)
    return sorted(os.path.dirname(path) for path in found)


class Lapses:
    """A process function for the timer tests: each event sets an event-time timer ``gap`` ms on and
    every second event cancels the previous one, so timers are pending at every moment; a firing
    reports the key's event count, which is exact only if events and timers are taken in timestamp
    order; every fifth count empties the state (the key then holds no memory)."""

    def __init__(self, gap: int = 45) -> None:
        self.gap = gap

    def on_event(self, event, ctx) -> None:
        state = ctx.state
        state["n"] = state.get("n", 0) + 1
        if state["n"] % 2 == 0 and "due" in state:
            ctx.timers.cancel(state["due"])
        state["due"] = event["ts"] + self.gap
        ctx.timers.at(state["due"])

    def on_timer(self, ts, key, ctx) -> None:
        ctx.emit({"key": key, "timer": ts, "n": ctx.state.get("n", 0)})
        if ctx.state.get("n", 0) % 5 == 0:
            ctx.state.clear()


def _lapses_process():
    from pescheduler.operators.process import Process

    return Process.named("lapses", Lapses)


LapsesProcess = _lapses_process()           # a process function registered by name ("lapses")


def process_reference(fn, events: list, key: str = "key", ttl: int | None = None) -> dict:
    """Plain-Python reference of ``key_by(key).process(fn)`` over a finite stream: per key, its events
    by ``ts`` (arrival order within a timestamp), each event-time timer at ``T`` called after the events
    with ``ts <= T`` and before later ones, the rest at the end. Returns ``{key: [emitted, ...]}``."""
    by_key: dict = {}
    for e in events:
        by_key.setdefault(e[key], []).append(e)
    return {k: _reference_key(fn, k, sorted(evs, key=lambda e: e["ts"]), ttl) for k, evs in by_key.items()}


class _ReferenceContext:
    def __init__(self, key) -> None:
        self.key, self.state, self.pending, self.out, self.last = key, {}, set(), [], None
        self.timers = self
        self.emit = self.out.append

    def at(self, ts) -> None:
        self.pending.add(ts)

    def cancel(self, ts) -> None:
        self.pending.discard(ts)

    def expire(self, now, ttl) -> None:
        if ttl is not None and self.last is not None and now - self.last >= ttl:
            self.state = {}

    def fire_before(self, fn, bound, ttl) -> None:
        while self.pending and min(self.pending) < bound:
            ts = min(self.pending)
            self.pending.discard(ts)
            self.expire(ts, ttl)
            fn.on_timer(ts, self.key, self)


def _reference_key(fn, k, events: list, ttl) -> list:
    ctx = _ReferenceContext(k)
    for e in events:
        ctx.fire_before(fn, e["ts"], ttl)
        ctx.expire(e["ts"], ttl)
        fn.on_event(e, ctx)
        ctx.last = e["ts"]
    ctx.fire_before(fn, float("inf"), ttl)
    return ctx.out


def merge_asof(lefts, rights, tolerance, direction, key="k", ident="id"):
    """Plain-Python reference of ``join_asof``: pandas ``merge_asof(left, right, on="ts", by=key)``
    over inputs sorted by ts (stably, so ties keep arrival order): ``{left id: right id | None}``."""
    import bisect

    by_key: dict = {}
    for r in rights:
        by_key.setdefault(r[key], []).append(r)
    for rs in by_key.values():
        rs.sort(key=lambda r: r["ts"])
    times = {k: [r["ts"] for r in rs] for k, rs in by_key.items()}
    out = {}
    for l in lefts:
        mine, ts = by_key.get(l[key], []), times.get(l[key], [])
        i, j = bisect.bisect_right(ts, l["ts"]), bisect.bisect_left(ts, l["ts"])
        back = mine[i - 1] if i else None           # the last of a tie: the sort is stable
        fwd = mine[j] if j < len(mine) else None    # the first of a tie
        if direction == "backward":
            pick = back
        elif direction == "forward":
            pick = fwd
        elif back is None or fwd is None:
            pick = back or fwd
        else:
            pick = fwd if fwd["ts"] - l["ts"] < l["ts"] - back["ts"] else back
        if pick is not None and tolerance is not None and abs(pick["ts"] - l["ts"]) > tolerance:
            pick = None
        out[l[ident]] = None if pick is None else pick[ident]
    return out

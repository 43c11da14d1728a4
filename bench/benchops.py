"""Operators used only by benchmarks (loaded with ``plugins=["benchops"]``; bench/ is on sys.path).

``replay`` pre-generates distinct connected-car events in ``open()`` so that a
channel benchmark measures the channel, not the generator; ``throughput``
records when the first and last tuples arrived (and per-batch latency when
tuples carry a ``sent`` stamp) and writes them to ``path`` at end of stream.
"""

from __future__ import annotations

import json
import time

import pescheduler
from pescheduler import Sink, Source


class Replay(Source):
    name = "replay"

    def __init__(self, events: int = 1_000_000, stamp: bool = False, **kw) -> None:
        super().__init__(ts_field=None, **kw)
        self.events, self.stamp, self.i = events, stamp, 0

    def open(self, context) -> None:
        super().open(context)
        from pescheduler.operators.sources import GeneratorSource

        gen = GeneratorSource(events=min(self.events, 200_000), keys=10_000, seed=1)
        self.pool = []
        while (batch := gen.read(10_000)) is not None:
            self.pool.extend(batch)

    def read(self, n):
        if self.i >= self.events:
            return None
        start = self.i % len(self.pool)
        batch = self.pool[start:start + min(n, self.events - self.i)]
        self.i += len(batch)
        if self.stamp:
            now = time.monotonic()
            batch = [{**t, "sent": now} for t in batch]
        return batch


class Throughput(Sink):
    name = "throughput"

    def __init__(self, path: str) -> None:
        self.path = path
        self.first = self.last = None
        self.count = 0
        self.latencies: list[float] = []

    def process(self, batch, emit):
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now
        self.count += len(batch)
        if batch and "sent" in batch[0]:
            self.latencies.append(now - batch[0]["sent"])

    def flush(self, emit):
        with open(self.path, "w") as f:
            json.dump({"first": self.first, "last": self.last, "count": self.count,
                       "latencies": self.latencies}, f)


@pescheduler.hookimpl
def pescheduler_operators():
    return [Replay, Throughput]

"""A copied window at overload keeps flowing, and ends exact (issue 20, item 1).

The source is offered far more than two cores process (400,000 tuples/s),
channels get a single credit (so a credit window is always nearly used up)
and windows are 100 ms of event time (so the copy sends partials back to its
original's PE on almost every batch): the PE of the original and its copy
feed each other, the cycle that deadlocked. Every monitor window after the
copy must show an instance taking tuples, each must take some over the five,
no stall may be reported, and
after the drain every window count must equal a plain-Python count of the
events the source emitted (nothing lost or doubled by the replays).
"""

from __future__ import annotations

import json
from collections import Counter

import dask.config
import pytest

import pescheduler
from pescheduler import Application, Replicate
from pescheduler.operators.sources import GeneratorSource

pytestmark = pytest.mark.integration

GENERATOR = dict(keys=1000, seed=3)
WINDOW_MS = 100
WAIT = 60


def reference(n: int) -> Counter:
    """(car, window start) -> events, over the generator's first ``n`` events."""
    source, counts, seen = GeneratorSource(events=n, **GENERATOR), Counter(), 0
    while (batch := source.read(10_000)) is not None:
        for e in batch:
            counts[(e["car"], e["ts"] - e["ts"] % WINDOW_MS)] += 1
        seen += len(batch)
    assert seen == n
    return counts


def next_snapshot(dep):
    """The next monitor snapshot; if none comes in WAIT s, fail with the deployment's state."""
    try:
        return dep.next_snapshot(timeout=WAIT)
    except TimeoutError:
        status = dep.status()
        raise AssertionError(f"no snapshot in {WAIT} s: {status['state']} {status.get('error')} "
                             f"{[e['text'][:300] for e in status['events'][-6:]]} {dep.pe_stats()}") from None


def test_a_copied_window_keeps_flowing_at_overload_and_ends_exact(cluster, tmp_path):
    out = tmp_path / "counts.jsonl"
    app = Application("overload-window")
    (app.source("generator", events=None, rate=400_000, **GENERATOR)
        .key_by("car")
        .window(size=WINDOW_MS, aggregates={"n": ("count", "speed")})
        .sink("jsonl", path=str(out)))
    with dask.config.set({"pescheduler.channel.credits": 1}):
        dep = pescheduler.deploy(app, cluster=cluster, policies=[])
    try:
        for _ in range(WAIT):
            if dep.next_snapshot(timeout=WAIT).operators.get("window-3", None) and \
                    dep.snapshot().operators["window-3"].tuples_in > 0:
                break
        record = dep.apply(Replicate("window-3", 1), timeout=WAIT)
        assert record.applied, record.reason
        first = next_snapshot(dep)                      # the window in which the copy started
        for _ in range(5):          # the deadlock stopped both for good; a loaded machine may starve one a while
            snap = next_snapshot(dep)
            flowing = {op: snap.operators[op].tuples_in_per_s for op in ("window-3", "window-3#1")}
            assert any(rate > 0 for rate in flowing.values()), f"both instances stopped: {flowing}"
        grew = {op: snap.operators[op].tuples_in - first.operators[op].tuples_in for op in ("window-3", "window-3#1")}
        assert all(n > 0 for n in grew.values()), f"an instance took nothing in 5 s: {grew}"
    finally:
        status = dep.stop(drain_timeout=WAIT)
    assert status["state"] == "stopped", status["error"]
    texts = [f"{e['kind']}: {e['text']}" for e in status["events"]]
    assert not any(e["kind"] == "stalled" or "did not finish" in e["text"] for e in status["events"]), texts
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    got = Counter()
    for r in rows:
        got[(r["car"], r["window_start"])] += r["n"]
    assert sum(got.values()) > 10_000
    assert got == reference(sum(got.values()))

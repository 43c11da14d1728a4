"""The monitor on a deliberately slow operator, and the status a user reads."""

from __future__ import annotations

import time

import pytest

import pescheduler
from pescheduler import Application

pytestmark = pytest.mark.integration


def slow(t):
    time.sleep(0.0005)          # 0.5 ms a tuple: about 2,000 tuples/s at most
    return t


def test_slow_operator_is_busy_and_its_upstream_backpressured(cluster, tmp_path):
    app = Application("slow")
    app.source("numbers", count=10**9).map(slow).sink("jsonl", path=str(tmp_path / "o.jsonl"))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"]) as dep:
        assert list(dep.placement().pes) == ["numbers-1", "map-2", "jsonl-3"]
        deadline = time.monotonic() + 30
        snap = dep.next_snapshot(timeout=30)
        while not (snap.operators.get("map-2") and snap.operators["map-2"].busy > 0.8
                   and snap.pes["numbers-1"].backpressure > 0.5):
            assert time.monotonic() < deadline, f"monitor never showed it: {snap}"
            snap = dep.next_snapshot(timeout=30)
        source, mapper, sink = snap.pes["numbers-1"], snap.pes["map-2"], snap.pes["jsonl-3"]
        assert mapper.busy > 0.8 and source.backpressure > 0.5
        assert 500 < snap.operators["map-2"].tuples_in_per_s < 2500
        assert sink.idle > 0.5                                     # waits for the slow map
        for pe in (source, mapper, sink):
            assert 0.7 < pe.busy + pe.backpressure + pe.idle < 1.2, pe
        assert {w.worker for w in snap.workers.values()} == set(dep.placement().workers)
        assert all(w.memory_bytes > 0 for w in snap.workers.values())
        assert dep.status()["pes"][1]["busy"] == pytest.approx(dep.snapshot().pes["map-2"].busy)

"""The monitor on a deliberately slow operator, and the status a user reads."""

from __future__ import annotations

import os
import time

import pytest
from distributed import Client

import pescheduler
from pescheduler import Application

pytestmark = pytest.mark.integration


def slow(t):
    time.sleep(0.0005)          # 0.5 ms a tuple: about 2,000 tuples/s at most
    return t


def test_slow_operator_is_busy_and_its_upstream_backpressured(cluster, tmp_path):
    app = Application("slow")
    app.source("numbers", count=10**9).map(slow).sink("jsonl", path=str(tmp_path / "o.jsonl"))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
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
        # Its 0.5 s batches run in the PE's own thread, so the worker still answers at once.
        assert mapper.threaded and not source.threaded
        assert any(e["kind"] == "thread" and "map-2" in e["text"] for e in dep.status()["events"])
        with Client(cluster) as client:
            for _ in range(5):
                t0 = time.perf_counter()
                client.run(os.getpid, workers=[mapper.worker])
                assert time.perf_counter() - t0 < 0.25

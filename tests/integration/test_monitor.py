"""The monitor on a deliberately slow operator, and the status a user reads."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
from distributed import Client

import pescheduler
from pescheduler import Application
from waiting import reap

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
        # Its 0.5 s batches run in the PE's own thread, so the worker's event loop never waits one out.
        assert mapper.threaded and not source.threaded
        assert mapper.threaded_because.startswith("a turn took"), mapper.threaded_because
        assert any(e["kind"] == "thread" and "map-2" in e["text"] and "a turn took" in e["text"]
                   for e in dep.status()["events"])
        with Client(cluster) as client:
            late = client.run(loop_lateness, 2.0, workers=[mapper.worker])[mapper.worker]
        assert late < 0.3, f"the worker's loop was {late:.3f} s late: a 0.5 s batch ran on it"


_slept: list[float] = []


def slow_once(t):
    """0.3 s on the first tuple this worker process maps, then nothing: one long turn."""
    if not _slept:
        _slept.append(t)
        time.sleep(0.3)
    return t


def test_a_pe_sent_to_its_thread_by_one_long_turn_comes_back_to_the_loop(cluster, tmp_path):
    """One long turn sends the map's PE to its own thread; after BACK_AFTER_S of short turns it is
    back on its worker's loop, and the status says both, with the turn's length (turns.py)."""
    from pescheduler.worker.turns import BACK_AFTER_S

    app = Application("once")
    app.source("numbers", count=10**9).map(slow_once).sink("jsonl", path=str(tmp_path / "o.jsonl"))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        def said() -> list[str]:
            return [e["text"] for e in dep.status()["events"] if e["kind"] == "thread" and "map-2" in e["text"]]

        deadline = time.monotonic() + BACK_AFTER_S + 60
        while len(said()) < 2:
            assert time.monotonic() < deadline, f"map-2 never came back to the loop: {said()}"
            dep.next_snapshot(timeout=30)
        went, back = said()
        assert "works in its own thread: a turn took" in went and "back on its worker's event loop" in back
        assert not dep.snapshot().pes["map-2"].threaded
        assert dep.snapshot().pes["map-2"].tuples_in_per_s > 0


async def loop_lateness(seconds: float, step: float = 0.01) -> float:
    """On a worker's event loop (``Client.run`` runs a coroutine function there): the most a
    ``step`` sleep overran in ``seconds``. A 0.5 s batch on the loop makes one overrun by about
    0.5 s; a busy machine by a few scheduler slices. (A timed call from the client measured the
    scheduler's and the client's loops too: 0.80 s in a suite at load 4-5, nothing blocked.)"""
    loop = asyncio.get_running_loop()
    worst, end = 0.0, loop.time() + seconds
    while loop.time() < end:
        t = loop.time()
        await asyncio.sleep(step)
        worst = max(worst, loop.time() - t - step)
    return worst


def test_a_hosts_cpu_is_what_the_deployment_uses_not_what_other_users_load_the_machine_with(cluster, tmp_path):
    """Two busy loops of another user fill the machine's cores; a light stream's host still shows
    CPU to spare (its own processes' use), and ``machine_cpu`` shows the machine's load. Counted
    in, every Replicate on a shared machine was refused at load 8 (issue 15)."""
    app = Application("light")
    app.source("generator", events=None, keys=10, rate=500).sink("jsonl", path=str(tmp_path / "o.jsonl"))
    others = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
            deadline = time.monotonic() + 60
            snap = dep.next_snapshot(timeout=30)
            while not (snap.hosts and all(h.machine_cpu >= 0.9 for h in snap.hosts.values())
                       and snap.operators.get("generator-1") and snap.operators["generator-1"].tuples_out_per_s > 0):
                assert time.monotonic() < deadline, f"the busy loops never showed: {snap.hosts}"
                snap = dep.next_snapshot(timeout=30)
            for host in snap.hosts.values():
                assert host.cpu < 0.6, host             # 500 tuples/s: a small part of the cores
                assert snap.saturated(host.host, 0.9) is None
            assert dep.status()["hosts"][0]["machine_cpu"] >= 0.0
    finally:
        for p in others:
            reap(p)

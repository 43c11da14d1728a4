"""Deployed: the status shows the checkpoint in flight, its phase and the workers it waits for.

A whole-state checkpoint of 10^7 keys takes tens of seconds (docs/state.md, "Limits, and what is
next"), and the status said only what had completed: a long checkpoint and a hung one looked alike
until ``pescheduler.checkpoint.timeout``. Here a PE's snapshot is held at a checkpoint's barrier on
a real 2-worker cluster: ``status()["checkpoints"]["in_flight"]`` names that checkpoint, in its
``snapshots`` phase, waiting for the PE's worker (and those downstream of it, which the barrier
has not reached), for as long as it is held; once let go, the
checkpoint completes and what is in flight is a later one or none.
"""

from __future__ import annotations

import dask
import pytest
from waiting import newest_checkpoint, until

import pescheduler
from pescheduler import Application

pytestmark = pytest.mark.integration

WAIT = 120


def test_the_status_names_the_checkpoint_in_flight_and_the_worker_it_waits_for(cluster, tmp_path):
    import socket

    hold, release = tmp_path / "hold", tmp_path / "r"
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(release))
    listening.listen(1)
    listening.settimeout(WAIT)
    app = Application("checkpoint-in-flight")
    (app.source("numbers", count=1_000_000, keys=10, hold_at=5_000, release=str(tmp_path / "end"))
        .apply("held_snapshot", hold=str(hold), release=str(release), id="held").sink("collect"))
    with dask.config.set({"pescheduler.checkpoint.timeout": f"{WAIT}s"}), \
            pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[],
                               checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.3s") as dep:
        until(lambda: newest_checkpoint(dep) >= 1, WAIT, "a first checkpoint")
        hold.touch()
        done = newest_checkpoint(dep)

        seen = []

        def held() -> bool:
            flight = dep.status()["checkpoints"]["in_flight"]
            seen[:] = [flight]
            return bool(flight and flight["id"] > done and flight["age_s"] >= 1.0)

        until(held, WAIT, "a checkpoint held for a second")
        flight = seen[0]
        worker = dep.placement().pes[next(p for p, pe in dep.placement().pes.items() if "held" in pe.operators)].worker
        assert flight["phase"] == "snapshots" and worker in flight["waiting_for"], flight
        assert newest_checkpoint(dep) == done, "a checkpoint completed while the snapshot was held"
        again = dep.status()["checkpoints"]["in_flight"]
        assert again["id"] == flight["id"] and again["age_s"] >= flight["age_s"], (flight, again)
        conn, _ = listening.accept()        # the held snapshot, connected
        hold.unlink()                       # later snapshots are not held
        conn.sendall(b"g")
        conn.close()
        until(lambda: newest_checkpoint(dep) >= flight["id"], WAIT, "the held checkpoint complete")
        now = dep.status()["checkpoints"]["in_flight"]
        assert now is None or now["id"] > flight["id"], now
        (tmp_path / "end").touch()
    listening.close()

"""A stall is reported, named and fails the run (issue 20, item 1: the stall detector).

An operator that stops answering (here: it sleeps, after its PE moved to a
thread, so the worker still answers the monitor) leaves input queued and the
source blocked on credit: no PE makes progress. With
``pescheduler.stall.timeout`` at 2 s the deployment must go to ``stalled`` with
an event naming the PE that waits for credit, the channel and the PE it waits
on, and then fail (the CLI exits non-zero on ``failed``).
"""

from __future__ import annotations

import time

import dask.config
import pytest

import pescheduler
from pescheduler import Application
from pescheduler.errors import DeploymentFailed

pytestmark = pytest.mark.integration

STUCK_S = 8.0


def stuck_later(t, calls=[0]):       # noqa: B006 - per-worker call count, shipped with the function
    """Slow at first (its PE takes a thread), then stuck for STUCK_S (bounded, so the PE can stop)."""
    calls[0] += 1
    if calls[0] == 1:
        time.sleep(0.3)
    elif calls[0] == 20_000:
        time.sleep(STUCK_S)
    return t


def test_a_stalled_pipeline_is_reported_with_who_waits_on_whom_and_fails(cluster):
    app = Application("stall")
    app.source("numbers", count=10**9).map(stuck_later).sink("collect")
    with dask.config.set({"pescheduler.stall.timeout": "2s"}):
        dep = pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[])
        try:
            with pytest.raises(DeploymentFailed, match="stalled"):
                dep.wait(timeout=60)
            status = dep.status()
        finally:
            dep.stop()
    assert status["state"] == "failed"
    stalled = [e["text"] for e in status["events"] if e["kind"] == "stalled"]
    assert stalled, status["events"]
    assert "numbers-1 -[" in stalled[0] and "]-> map-2" in stalled[0], stalled[0]
    assert "input queued at: map-2" in stalled[0], stalled[0]

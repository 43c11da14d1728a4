"""A reconfiguration's ``deploy + start + rewire`` step (a Replicate's ``open``, before its pause) is bounded on standing still, as the drain is,
and says what it waits for.

Under load (the property test, disk window, loads 5-12) a Replicate's step passed its 10 s bound:
the copy's deploy and the router's rewire had not answered, and the record said nothing of where
they were (the test's bound was raised to 30 s). Here ``execute`` runs a real Replicate's plan
(the original keeps running, its PE exports the copy's key groups live) against workers whose
deploy moves through its parts, or stands still.
"""

from __future__ import annotations

import asyncio
import time

import cloudpickle
import pytest

from pescheduler.actions import Replicate
from pescheduler.control.protocol import ReconfigurationFailed, execute, plan_reconfiguration
from pescheduler.plan.transforms import transform
from pescheduler.plan.wiring import channel_ids

from keyed_handover import WORKERS, placed_keyed_window

BOUND = 0.5


def _replicate():
    old, window = placed_keyed_window()
    new = transform(old, Replicate(window, 1))
    return old, new, plan_reconfiguration(old, new, channel_ids(old, "d", 0), "d", 1)


class _Gateway:
    """The deployment's calls to its PE hosts, answered at once except the copy's deploy: it takes
    ``deploy_s``, passing a part every ``part_s`` on its worker (what ``pe_calls`` shows), or
    none (``part_s`` None: stuck in its connect)."""

    def __init__(self, deploy_s: float, part_s: float | None) -> None:
        self.deployment = "d"
        self.deploy_s, self.part_s = deploy_s, part_s
        self.began: float | None = None
        self.deployed_on = ""

    async def deploy(self, worker, specs):
        self.began, self.deployed_on = time.monotonic(), worker
        await asyncio.sleep(self.deploy_s)
        return {"began": time.time(), "ms": {"connect": self.deploy_s * 1000}}

    async def calls(self, worker):
        open_ = []
        if worker == self.deployed_on and self.began is not None:
            ran = time.monotonic() - self.began
            parts = int(ran / self.part_s) if self.part_s else 0
            open_ = [{"call": "deploy copy", "parts": {f"part {i}": self.part_s * 1000 for i in range(parts)},
                      "since_ms": 0.0 if self.part_s else ran * 1000}]
        return {"worker": worker, "calls": open_, "opening": ["copy -> d/1/sink" for _ in open_]}

    async def rewire(self, worker, pe_id, **changes):
        return {"began": time.time(), "ms": {}}

    async def drain_status(self, worker, marker, timeout, aligned, seen, queued=None):
        return {"missing": [], "failed": [], "progress": 0, "times": {}}

    async def handover_go(self, worker, tag):
        return None

    async def handover_wait(self, worker, tag, timeout):
        return {"groups": 1, "pending": 0, "bytes": 0, "buffered": 0, "peak": 0, "done_at": time.time(),
                "failed": None}

    async def snapshot(self, worker, pe_ids):
        return cloudpickle.dumps({})

    async def stats(self, workers, dead_letters=True, acked=None):
        return []


def _execute(gateway, steps):
    old, new, plan = _replicate()
    assert plan.created and not plan.retired and plan.moves, "a live Replicate: no pause, a deploy and a rewire"
    info = {w: {"data_address": w} for w in WORKERS}
    return asyncio.run(execute(gateway, old, new, plan, info, "m1", BOUND, steps))


def test_a_deploy_that_keeps_passing_its_parts_past_the_bound_completes():
    """On main: ``step 'deploy + start + rewire' took more than 0s`` (a fixed bound on its length)."""
    steps = {}
    _execute(_Gateway(deploy_s=6 * BOUND, part_s=BOUND / 4), steps)
    assert steps["open"] >= 5 * BOUND * 1000, steps      # the copy is deployed before the pause (h30q)
    # where the call stood at the controller's last look: its worker and its time so far
    assert any(k.startswith("open: open deploy copy on tcp://") for k in steps), steps


def test_a_deploy_that_stands_still_fails_after_the_bound_naming_the_call_and_its_worker():
    """On main the failure said only ``took more than 0s``: not which call, worker or part."""
    gateway = _Gateway(deploy_s=60, part_s=None)
    t0 = time.monotonic()
    with pytest.raises(ReconfigurationFailed) as failed:
        _execute(gateway, {})
    assert BOUND <= time.monotonic() - t0 < 10 * BOUND
    why = str(failed.value)
    assert "no answer from ['open: deploy " in why and "nothing moved for" in why, why
    assert f"{gateway.deployed_on}: deploy copy after ['its start']" in why, why
    assert "channels still opening: ['copy -> d/1/sink']" in why, why

"""A rescale of a KEYED operator hands key groups worker to worker: the deploying process never
receives the state, and the instance that keeps its worker keeps running (docs/state.md)."""

from __future__ import annotations

import pytest

import pescheduler
from pescheduler import Application, Release, Replicate
from pescheduler.control.gateway import WorkerGateway
from test_copies import until           # the next monitor snapshot where a predicate holds

pytestmark = pytest.mark.integration

KEYS = 20_000
COUNT = 400_000
RATE = 40_000


class Through:
    """Bytes of operator state that reached the deploying process (``pe_snapshot`` answers)."""

    def __init__(self, monkeypatch) -> None:
        self.snapshot_bytes = 0
        snapshot = WorkerGateway.snapshot

        async def counted_snapshot(gateway, worker, pe_ids, *leave_out):
            blob = await snapshot(gateway, worker, pe_ids, *leave_out)
            self.snapshot_bytes += len(blob)
            return blob

        monkeypatch.setattr(WorkerGateway, "snapshot", counted_snapshot)


def test_a_replicate_and_release_of_a_big_keyed_window_pass_no_state_through_the_deployer(monkeypatch, tmp_path):
    through = Through(monkeypatch)
    release = tmp_path / "go-on"
    app = Application("handover")
    # paced: the second half flows for at least 5 s, so the Release finds the copy still running
    (app.source("numbers", count=COUNT, keys=KEYS, rate=RATE, hold_at=COUNT // 2, release=str(release)).key_by("key")
        .window(count=10**6, aggregates={"total": ("sum", "n")}).sink("discard"))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[]) as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("count_window"))
        original = dep.placement().pe_of(op)
        before = until(dep, lambda s: op in s.operators and s.operators[op].tuples_in >= KEYS, "every key held")
        record = dep.apply(Replicate(op, 1))
        assert record.applied and record.retired == () and record.created == (f"{op}#1",), record.as_dict()
        assert through.snapshot_bytes == 0
        # the original's PE ran on: its counters went on from where they were (a new PE starts at 0)
        after = until(dep, lambda s: f"{op}#1" in s.operators, "the copy is there")
        assert after.operators[op].tuples_in >= before.operators[op].tuples_in
        release.touch()                                    # the second half flows to both
        until(dep, lambda s: s.operators[f"{op}#1"].tuples_in > 0, "the copy counts")
        record = dep.apply(Release(op, 1))
        assert record.applied and record.retired == (f"{op}#1",) and record.created == (), record.as_dict()
        assert dep.placement().pe_of(op) == original
        # the released copy's ~KEYS/2 keys went worker to worker; what the deployer got of its PE
        # is the emptied window's frame, not its keys (the bytes the workers handed to each other,
        # in the background after the pause: the record's figure, docs/state.md)
        assert record.steps.get("moving: bytes", 0) > 10 * KEYS // 2, record.steps
        assert through.snapshot_bytes < 5_000, through.snapshot_bytes
        assert dep.wait(timeout=120)["state"] == "finished"

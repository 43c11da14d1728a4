"""A keyed process function with event-time timers pending, copied and released on a real Dask
deployment while tuples flow, or its worker SIGKILLed and the deployment restored from a checkpoint:
every timer fires exactly once, as in the plain-Python reference, with its keys' records in either
keyed state backend (on ``disk``: a RocksDB store per instance, on its worker).

The source holds its last tuples until the test has applied the Replicate and the Release, so both
happen mid-stream however slow the machine; every key has timers pending at every moment
(support_ops.Lapses), and a firing reports the key's event count, which is right only when the
key's state and timers moved together.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import pescheduler
from pescheduler import Application, Release, Replicate
from support_ops import Lapses, committed_output, copy_holds, process_reference, replicated
from test_keyed_state_deploy import stores       # the operator stores under pescheduler.state.dir
from waiting import until

pytestmark = pytest.mark.integration

COUNT, KEYS, RATE, GAP = 12_000, 20, 2_000, 45
WAIT = 120          # seconds: the bound on every wait


def tuples_in(dep, op: str) -> None:
    """Wait (bounded) until ``op`` has processed a tuple."""
    deadline = time.monotonic() + WAIT
    while True:
        snap = dep.next_snapshot(timeout=WAIT)
        if op in snap.operators and snap.operators[op].tuples_in > 0:
            return
        assert time.monotonic() < deadline, f"{op} never got a tuple"


def replicated_and_released(dep, op: str, release) -> dict:
    """Replicate ``op`` once it has tuples, let the source go on (its first hold), Release the copy
    once that has some, then let the source (held until the file ``release`` exists) finish: the
    deployment's final status (the source held by ``support_ops.copy_holds``)."""
    tuples_in(dep, op)
    rec = dep.apply(Replicate(op, 1), timeout=WAIT)
    assert rec.applied, rec.reason
    replicated(release)
    tuples_in(dep, f"{op}#1")
    rec = dep.apply(Release(op, 1), timeout=WAIT)
    assert rec.applied, rec.reason
    release.touch()
    return dep.wait(timeout=WAIT)


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_replicate_and_release_fire_every_pending_timer_exactly_once(cluster, tmp_path, monkeypatch, backend):
    out, release = tmp_path / "alerts.jsonl", tmp_path / "release"
    app = Application(f"process-copies-{backend}")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=RATE, **copy_holds(release, COUNT))
        .key_by("key").process(Lapses, gap=GAP, id="lapses").sink("jsonl", path=str(out)))
    where = {"cluster": cluster} if backend == "memory" else {"workers": 2}
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path))       # the forked workers' setting
    with pescheduler.deploy(app, plugins=["support_ops"], policies=[], state=backend, **where) as dep:
        if backend == "disk":
            tuples_in(dep, "lapses")
            assert len(stores(tmp_path)) == 1, stores(tmp_path)        # the records' RocksDB
        status = replicated_and_released(dep, "lapses", release)
    assert status["state"] == "finished", status
    assert stores(tmp_path) == []                                      # removed with the deployment
    assert_equals_reference([json.loads(line) for line in out.read_text().splitlines()])


def assert_equals_reference(rows: list) -> None:
    got: dict = {}
    for row in rows:
        got.setdefault(row["key"], []).append(row)
    events = [{"key": i % KEYS, "ts": i, "n": i} for i in range(COUNT)]
    want = process_reference(Lapses(GAP), events)
    assert sum(map(len, want.values())) > COUNT // 4
    assert got == want


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_sigkilled_worker_restored_from_a_checkpoint_fires_every_timer_exactly_once(tmp_path, monkeypatch, backend):
    out = tmp_path / "alerts.jsonl"
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path / "stores"))
    app = Application(f"process-recovery-{backend}")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=RATE)     # Lapses as registered by support_ops
        .key_by("key").process("lapses", gap=GAP, id="lapses").sink("jsonl", path=str(out)))
    assert_equals_reference(killed_and_restored(app, "lapses", tmp_path, out, state=backend))


def killed_and_restored(app, op: str, tmp_path, out, state: str = "memory") -> list:
    """Deploy ``app`` on three workers with checkpoints, SIGKILL the worker of ``op`` after the first
    complete one, wait for the restored deployment to finish: what its jsonl sink ``out`` committed."""
    with pescheduler.deploy(app, workers=3, plugins=["support_ops"], policies=[], state=state,
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.5s") as dep:
        until(lambda: dep.checkpoints(), WAIT, "a complete checkpoint")
        placement = dep.placement()
        worker = placement.pes[placement.pe_of(op)].worker
        os.kill(dep.worker_info[worker]["pid"], signal.SIGKILL)
        status = dep.wait(timeout=WAIT)
        assert dep.status()["checkpoints"]["restart"]["restarts"], "no restart was recorded"
    assert status["state"] == "finished", status
    return committed_output(out)

"""Keyed state checkpointed by the workers as key-group files, restored by the workers after a SIGKILL.

A count window (its state in the deployment's keyed-state backend) on a real
3-worker embedded cluster, checkpoints every 0.5 s: the workers write the
key groups straight into the checkpoint directory (``<pe>.<n>.gNNN.full``
and ``.delta`` files the signed manifest lists, or, at 300 keys, held in
the PE's ``.state``); the window's worker is
SIGKILLed mid-stream; the restored window's worker reads its key groups' files
itself. The committed output matches a plain-Python reference exactly, on both
backends.
"""

from __future__ import annotations

import glob
import json
import os
import signal

import pytest

import pescheduler
from pescheduler import Application
from pescheduler.state.incremental import load_state_file
from waiting import until

pytestmark = pytest.mark.integration

WAIT = 120
COUNT, KEYS, RATE = 30_000, 300, 3_000


def expected_rows() -> list[tuple]:
    """Tumbling windows of 10 tuples per key over n = 0..COUNT-1 (key = n % KEYS, ts = n)."""
    rows = []
    for key in range(KEYS):
        ns = list(range(key, COUNT, KEYS))
        rows += [(key, ns[w * 10], ns[w * 10 + 9] + 1, sum(ns[w * 10:w * 10 + 10])) for w in range(len(ns) // 10)]
    return sorted(rows)


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_count_window_killed_mid_stream_restores_its_key_groups_from_the_workers_files(tmp_path, monkeypatch,
                                                                                      backend):
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path / "stores"))      # the forked workers' setting
    out, ckpt = tmp_path / "out.jsonl", tmp_path / "ckpt"
    app = Application(f"incremental-{backend}")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=RATE).key_by("key")
        .window(count=10, aggregates={"total": ("sum", "n")}).sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=3, plugins=["support_ops"], policies=[], state=backend,
                            checkpoint=str(ckpt), checkpoint_interval="0.5s") as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("count_window"))
        until(lambda: len(dep.checkpoints()) >= 2, WAIT, "two complete checkpoints")
        groups = glob.glob(str(ckpt / "run-*" / "chk-*" / "*.g[0-9][0-9][0-9].*"))
        held = [p for p in glob.glob(str(ckpt / "run-*" / "chk-*" / "*.state"))      # 300 keys: small groups,
                if load_state_file(open(p, "rb").read()).get("deltas")]              # held in their PE's .state
        assert groups or held, "no key-group file written by a worker"
        placement = dep.placement()
        os.kill(dep.worker_info[placement.pes[placement.pe_of(op)].worker]["pid"], signal.SIGKILL)
        status = dep.wait(timeout=WAIT)
        done = dep.checkpoints()
        restarts = dep.status()["checkpoints"]["restart"]["restarts"]
    assert status["state"] == "finished" and restarts
    assert done and all(c["state_bytes"] > 0 for c in done)            # the state each one references
    with open(out) as f:
        rows = sorted((r["key"], r["window_start"], r["window_end"], r["total"]) for r in map(json.loads, f))
    assert rows == expected_rows()

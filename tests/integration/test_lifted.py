"""Lifted lambdas deployed (pescheduler/lift.py): on real workers the lifted map and filter give the
called lambdas' output and dead letters, and a function left a call is named once in the status."""

from __future__ import annotations

import json

import pytest

import pescheduler
from pescheduler import Application

pytestmark = pytest.mark.integration

WAIT = 120          # seconds: a bound on every wait, never a sleep
REMAINDER = 1


def test_lifted_lambdas_run_deployed_and_a_call_is_named_in_the_status(cluster, tmp_path):
    app = Application("lifted")
    out = tmp_path / "out.jsonl"
    (app.source("iterable", items=[{"x": i, "ts": i} for i in range(1000)])
        .map(lambda t: {**t, "inv": 100 / (t["x"] % 100), "y": t["x"] * 2})        # lifted
        .filter(lambda t: t["y"] % 3 == REMAINDER, id="global")                   # a global: called
        .filter(lambda t: t["inv"] > 3 and t["x"] is not None)                    # lifted
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        status = dep.wait(timeout=WAIT)
        dead = dep.dead_letters()
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    want = [i for i in range(1000) if i % 100 and (2 * i) % 3 == 1 and 100 / (i % 100) > 3]
    assert sorted(r["x"] for r in rows) == want and want
    assert sorted(d["item"]["x"] for d in dead) == list(range(0, 1000, 100))
    assert all("ZeroDivisionError" in d["error"] and d["op"] == "map-2" for d in dead)
    notes = [e["text"] for e in status["events"] if e["kind"] == "python"]
    assert notes == ["global calls its function per tuple (not lifted to an expression): "
                     "it reads the global 'REMAINDER', which may change"]

"""An operator of your own that names its keyed states (``KeyedOperator``: tests/support_ops.py's
``kept_sum``, two states) on a real 2-worker cluster, both backends: a copy added and released
while tuples flow, its key groups moving after the pause; every key's running sums exact."""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

import pescheduler
from pescheduler import Application, Release, Replicate
from support_ops import copy_holds, replicated
from test_copies import until           # the next monitor snapshot where a predicate holds
from test_keyed_state_deploy import stores

pytestmark = pytest.mark.integration

COUNT, KEYS = 40_000, 200


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_an_operator_naming_its_keyed_states_is_copied_and_released_live_exactly(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path))       # the forked workers' setting
    out, release = tmp_path / "sums.jsonl", tmp_path / "go-on"
    app = Application(f"kept-{backend}")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=20_000, **copy_holds(release, COUNT, COUNT // 4))
        .key_by("key").apply("kept_sum").sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state=backend) as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("kept_sum"))
        until(dep, lambda s: op in s.operators and s.operators[op].tuples_in > 0, "the sums count")
        if backend == "disk":                  # a RocksDB per keyed state, named after it
            assert sorted(d.rsplit("-", 2)[1] for d in stores(tmp_path)) == ["seen", "sums"]
        record = dep.apply(Replicate(op, 1))
        assert record.applied and dict(record.steps)["moving: groups after the pause"] > 0, record.as_dict()
        replicated(release)                    # the copy's tuples come after the Replicate, however slow
        until(dep, lambda s: s.operators.get(f"{op}#1") and s.operators[f"{op}#1"].tuples_in > 0,
              "the copy sums")
        record = dep.apply(Release(op, 1))
        assert record.applied and dict(record.steps)["moving: groups after the pause"] > 0, record.as_dict()
        release.touch()
        status = dep.wait(timeout=120)
    assert status["state"] == "finished"
    by_key = defaultdict(list)
    with open(out) as f:
        for r in map(json.loads, f):
            by_key[r["key"]].append(r)
    assert sorted(by_key) == list(range(KEYS))
    for key, got in by_key.items():
        ns = list(range(key, COUNT, KEYS))
        assert [r["n"] for r in got] == ns, key                            # each once, in order
        assert [r["sum"] for r in got] == [sum(ns[:i + 1]) for i in range(len(ns))], key
        assert [r["seen"] for r in got] == list(range(1, len(ns) + 1)), key

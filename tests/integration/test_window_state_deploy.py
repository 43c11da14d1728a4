"""The time window's state end to end, on both backends: on ``disk`` its panes are in a RocksDB
store on the worker, and a copy of it is added and released mid-stream by handing key groups over
(``Window.export_groups``/``import_groups``); the output is exactly a plain-Python computation."""

from __future__ import annotations

import json
import pytest

import pescheduler
from pescheduler import Application, Release, Replicate
from support_ops import copy_holds, replicated
from test_copies import until           # the next monitor snapshot where a predicate holds
from test_keyed_state_deploy import stores

pytestmark = pytest.mark.integration

RATE = 20_000
COUNT = 60_000
KEYS = 50
SIZE, SLIDE = 1000, 500


def expected_rows() -> list[tuple]:
    """Sliding windows of SIZE ms every SLIDE ms over n = 0..COUNT-1 (key = n % KEYS, ts = n)."""
    acc: dict = {}
    for n in range(COUNT):
        last = n - n % SLIDE
        for ws in range(last - SIZE + SLIDE, last + 1, SLIDE):
            c, s = acc.get((n % KEYS, ws), (0, 0))
            acc[(n % KEYS, ws)] = (c + 1, s + n)
    return sorted((k, ws, ws + SIZE, c, s) for (k, ws), (c, s) in acc.items())


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_time_window_is_copied_and_released_live_without_loss(tmp_path, monkeypatch, backend):
    """Replicate and Release while tuples flow: the original's PE runs through both (the copy's
    key groups are handed over) and every window's row is the reference's."""
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path))       # the forked workers' setting
    out, release = tmp_path / "windows.jsonl", tmp_path / "go-on"
    app = Application(f"window-state-{backend}")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=RATE, **copy_holds(release, COUNT, COUNT // 3))
        .key_by("key").window(SIZE, SLIDE, aggregates={"c": ("count", "n"), "s": ("sum", "n")})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state=backend) as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("window"))
        original = dep.placement().pe_of(op)
        until(dep, lambda s: op in s.operators and s.operators[op].tuples_in > 0, "the window counts")
        if backend == "disk":
            assert len(stores(tmp_path)) == 1              # the window's panes: a RocksDB on its worker
        record = dep.apply(Replicate(op, 1))
        assert record.applied and original not in record.retired, record.as_dict()
        replicated(release)                    # the copy's tuples come after the Replicate, however slow
        until(dep, lambda s: s.operators.get(f"{op}#1") and s.operators[f"{op}#1"].tuples_in > 0,
              "the copy counts")
        if backend == "disk":
            copy = dep.placement().pe_of(f"{op}#1")
            assert any(d.startswith(copy.replace("#", "_")) for d in stores(tmp_path))   # its own store
        copy = dep.placement().pe_of(f"{op}#1")
        record = dep.apply(Release(op, 1))
        assert record.applied and record.retired == (copy,), record.as_dict()
        assert dep.placement().pe_of(op) == original
        release.touch()
        status = dep.wait(timeout=120)
    assert status["state"] == "finished"
    with open(out) as f:
        rows = sorted((r["key"], r["window_start"], r["window_end"], r["c"], r["s"]) for r in map(json.loads, f))
    assert rows == expected_rows()
    assert stores(tmp_path) == []                          # removed when the deployment ended

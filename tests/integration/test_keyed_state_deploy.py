"""Keyed state on disk, end to end: a count window keeps its keys in RocksDB on the workers
while a copy of it is added and released mid-stream; the output is exact."""

from __future__ import annotations

import json
import os
import pytest

import pescheduler
from pescheduler import Application, Release, Replicate
from test_copies import until           # the next monitor snapshot where a predicate holds

pytestmark = pytest.mark.integration

RATE = 20_000
COUNT = 60_000
KEYS = 50


def stores(root) -> list[str]:
    """The operator stores under ``pescheduler.state.dir``: pescheduler-state/<deployment>/<store>."""
    base = os.path.join(root, "pescheduler-state")
    return [d for dep in (os.listdir(base) if os.path.isdir(base) else [])
            for d in os.listdir(os.path.join(base, dep))]


def expected_rows() -> list[tuple]:
    """Tumbling windows of 10 tuples per key over n = 0..COUNT-1 (key = n % KEYS, ts = n)."""
    rows = []
    for key in range(KEYS):
        ns = list(range(key, COUNT, KEYS))
        for w in range(len(ns) // 10):
            part = ns[10 * w:10 * w + 10]
            rows.append((key, part[0], part[-1] + 1, sum(part)))
    return sorted(rows)


def test_a_count_window_on_disk_is_copied_and_released_without_loss(tmp_path, monkeypatch):
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path))       # the forked workers' setting
    out = tmp_path / "windows.jsonl"
    app = Application("state-on-disk")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=RATE).key_by("key")
        .window(count=10, aggregates={"total": ("sum", "n")}).sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state="disk") as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("count_window"))
        until(dep, lambda s: op in s.operators and s.operators[op].tuples_in > 0, "the window counts")
        assert len(stores(tmp_path)) == 1                  # the window's RocksDB, on its worker
        assert dep.apply(Replicate(op, 1)).applied
        until(dep, lambda s: s.operators.get(f"{op}#1") and s.operators[f"{op}#1"].tuples_in > 0,
              "the copy counts")
        copy = f"{op}_1"                                   # the copy's PE (#1), as its store directory names it
        assert any(d.startswith(copy) for d in stores(tmp_path))   # its own RocksDB
        assert dep.apply(Release(op, 1)).applied
        status = dep.wait(timeout=120)
    assert status["state"] == "finished"
    with open(out) as f:
        rows = sorted((r["key"], r["window_start"], r["window_end"], r["total"]) for r in map(json.loads, f))
    assert rows == expected_rows()
    assert stores(tmp_path) == []                          # removed when the deployment ended


def test_an_unknown_backend_is_refused_before_anything_starts():
    app = Application("bad-state")
    app.source("numbers", count=10).key_by("key").window(count=2).sink("jsonl", path=os.devnull)
    with pytest.raises(ValueError, match="'rocks' is unknown; choose one of memory, disk"):
        pescheduler.deploy(app, workers=1, plugins=["support_ops"], state="rocks")

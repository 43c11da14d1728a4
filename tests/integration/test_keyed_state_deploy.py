"""Keyed state end to end, on both backends: a count window keeps its keys in the backend on
the workers (RocksDB on disk) while a copy of it is added, moved and released mid-stream; the
output is exact."""

from __future__ import annotations

import json
import os
import pytest

import pescheduler
from pescheduler import Application, Move, Release, Replicate
from pescheduler.state.settings import OWNER
from support_ops import copy_holds, replicated
from test_copies import until           # the next monitor snapshot where a predicate holds

pytestmark = pytest.mark.integration

RATE = 20_000
COUNT = 60_000
KEYS = 50


def stores(root) -> list[str]:
    """The operator stores under ``pescheduler.state.dir``, of every worker of the machine:
    pescheduler-state/<deployment>/<worker's process>/<store>, each by its name or, made ahead
    (``spare-<id>``), by the owner its file names (one no operator took yet is left out)."""
    base = os.path.join(root, "pescheduler-state")
    found = [os.path.join(base, dep, worker, d) for dep in _listed(base) for worker in _listed(os.path.join(base, dep))
             for d in _listed(os.path.join(base, dep, worker))]
    return [_owner(path) for path in found if not os.path.basename(path).startswith("spare-") or
            os.path.exists(os.path.join(path, OWNER))]


def _owner(path: str) -> str:
    if not os.path.basename(path).startswith("spare-"):
        return os.path.basename(path)
    with open(os.path.join(path, OWNER)) as f:
        return f.read()


def _listed(folder: str) -> list[str]:
    return os.listdir(folder) if os.path.isdir(folder) else []


def expected_rows() -> list[tuple]:
    """Tumbling windows of 10 tuples per key over n = 0..COUNT-1 (key = n % KEYS, ts = n)."""
    rows = []
    for key in range(KEYS):
        ns = list(range(key, COUNT, KEYS))
        for w in range(len(ns) // 10):
            part = ns[10 * w:10 * w + 10]
            rows.append((key, part[0], part[-1] + 1, sum(part)))
    return sorted(rows)


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_count_window_is_copied_moved_and_released_live_without_loss(tmp_path, monkeypatch, backend):
    """Replicate, Move of the copy and Release while tuples flow: the original's PE runs through
    all three (only the copy's PE is created, moved and retired) and the output is exact."""
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path))       # the forked workers' setting
    out, release = tmp_path / "windows.jsonl", tmp_path / "go-on"
    app = Application(f"state-{backend}")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=RATE, **copy_holds(release, COUNT, COUNT // 3))
        .key_by("key").window(count=10, aggregates={"total": ("sum", "n")}).sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state=backend) as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("count_window"))
        original = dep.placement().pe_of(op)
        until(dep, lambda s: op in s.operators and s.operators[op].tuples_in > 0, "the window counts")
        if backend == "disk":
            assert len(stores(tmp_path)) == 1              # the window's RocksDB, on its worker
        record = dep.apply(Replicate(op, 1))
        assert record.applied and original not in record.retired, record.as_dict()
        replicated(release)                    # the copy's tuples come after the Replicate, however slow
        until(dep, lambda s: s.operators.get(f"{op}#1") and s.operators[f"{op}#1"].tuples_in > 0,
              "the copy counts")
        copy = dep.placement().pe_of(f"{op}#1")
        if backend == "disk":
            assert any(d.startswith(copy.replace("#", "_")) for d in stores(tmp_path))   # its own RocksDB
        there = next(w for w in dep.placement().workers if w != dep.placement().pes[copy].worker)
        record = dep.apply(Move(copy, there))
        assert record.applied and record.retired == (copy,), record.as_dict()
        record = dep.apply(Release(op, 1))
        assert record.applied and record.retired == (copy,), record.as_dict()
        assert dep.placement().pe_of(op) == original
        release.touch()
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

"""A live Replicate and Release of a keyed window, on both backends: the reconfiguration ends at the
routing switch while the moving key groups are still on their way (the record says how many, and
when they were all in), the gaining instance holds their tuples meanwhile, and the output is
exactly a plain-Python reference's (docs/state.md, "How a rescale moves key groups")."""

from __future__ import annotations

import json

import pytest

import pescheduler
from pescheduler import Application, Release, Replicate
from support_ops import copy_holds, replicated
from test_copies import until           # the next monitor snapshot where a predicate holds
from test_keyed_state_deploy import COUNT, KEYS, RATE, expected_rows

pytestmark = pytest.mark.integration

GAP = 2 * KEYS          # a session gap larger than a key's spacing (KEYS): one session per key


def expected_sessions() -> list[tuple]:
    """One session per key over n = 0..COUNT-1 (key = n % KEYS, ts = n): its start and its sum."""
    return sorted((key, key, sum(range(key, COUNT, KEYS))) for key in range(KEYS))


def moved_after_the_pause(record) -> None:
    steps = record.steps
    assert steps["moving: groups after the pause"] > 0, steps
    assert steps["moving: done ms after the pause"] >= 0 and steps["moving: bytes"] > 0, steps
    assert 0 < steps["moving: done at"] <= record.at + 0.001, steps     # rounded to the ms


@pytest.mark.parametrize("kind", ["count", "session"])
@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_live_replicate_and_release_end_at_the_switch_and_stay_exact(tmp_path, monkeypatch, backend, kind):
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path))       # the forked workers' setting
    out, release = tmp_path / "windows.jsonl", tmp_path / "go-on"
    app = Application(f"off-pause-{kind}-{backend}")
    keyed = app.source("numbers", count=COUNT, keys=KEYS, rate=RATE,
                       **copy_holds(release, COUNT, COUNT // 3)).key_by("key")
    window = (keyed.window(count=10, aggregates={"total": ("sum", "n")}) if kind == "count"
              else keyed.window(gap=GAP, aggregates={"total": ("sum", "n")}))
    window.sink("jsonl", path=str(out))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state=backend) as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith(f"{kind}_window")
                  or x.startswith("session"))
        until(dep, lambda s: op in s.operators and s.operators[op].tuples_in > 0, "the window counts")
        record = dep.apply(Replicate(op, 1))
        assert record.applied and record.retired == (), record.as_dict()
        moved_after_the_pause(record)
        replicated(release)                    # the copy's tuples come after the Replicate, however slow
        until(dep, lambda s: s.operators.get(f"{op}#1") and s.operators[f"{op}#1"].tuples_in > 0,
              "the copy counts")
        record = dep.apply(Release(op, 1))
        assert record.applied and record.created == (), record.as_dict()
        moved_after_the_pause(record)
        release.touch()
        assert dep.wait(timeout=120)["state"] == "finished"
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    if kind == "count":
        assert sorted((r["key"], r["window_start"], r["window_end"], r["total"]) for r in rows) == expected_rows()
    else:
        assert sorted((r["key"], r["window_start"], r["total"]) for r in rows) == expected_sessions()

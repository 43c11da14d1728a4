"""The collection aggregates in a real deployment: a copy of the keyed window added and
released mid-stream moves key groups with their sets, lists, counters and sketches, and the
exact aggregates still come out exact."""

from __future__ import annotations

import json

import pytest

import pescheduler
from pescheduler import Application, Release, Replicate
from pescheduler.collection_aggregates import exact_percentile
from waiting import processed, snapshot_until

pytestmark = pytest.mark.integration

WAIT = 120          # seconds: the bound on every wait
COUNT, KEYS = 40_000, 50
AGGREGATES = {"distinct": ("count_distinct", "n"), "median": ("percentile", "n", 0.5),
              "first": ("first", "n"), "last": ("last", "n"), "top": ("top_k", "n", 3),
              "approx_distinct": ("approx_count_distinct", "n"),
              "approx_p90": ("approx_percentile", "n", 0.9)}


def reference() -> dict:
    """``(key, window_start) -> the n`` of ``numbers(COUNT, KEYS)`` in 1 s windows, in order."""
    windows: dict = {}
    for n in range(COUNT):
        windows.setdefault((n % KEYS, n // 1000 * 1000), []).append(n)
    return windows


def test_a_copy_of_the_window_mid_stream_keeps_the_exact_aggregates_exact(cluster, tmp_path):
    out, release = tmp_path / "aggs.jsonl", tmp_path / "release"
    app = Application("aggregates-copies")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=5_000, hold_at=COUNT // 2, release=str(release))
        .key_by("key").window(size=1000, aggregates=AGGREGATES).sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        snapshot_until(dep, processed("window-3"), WAIT, "the window processes tuples")
        rec = dep.apply(Replicate("window-3", 1))      # key groups move to the copy with their state
        assert rec.applied, rec.reason
        release.write_text("")                         # the second half flows through both
        snapshot_until(dep, processed("window-3#1"), WAIT, "the copy processes tuples")
        rec = dep.apply(Release("window-3", 1))        # and back, merged into the original
        assert rec.applied, rec.reason
        dep.wait(timeout=WAIT)
    with open(out) as f:
        rows = {(r["key"], r["window_start"]): r for r in map(json.loads, f)}
    expected = reference()
    assert sorted(rows) == sorted(expected), "a window is missing or doubled"
    for group, values in expected.items():
        row = rows[group]
        assert row["distinct"] == len(values)
        assert row["median"] == exact_percentile(values, 0.5)
        assert (row["first"], row["last"]) == (values[0], values[-1])
        assert row["top"] == [[v, 1] for v in values[:3]]
        assert row["approx_distinct"] == len(values)            # 20 values: HLL is exact this small
        assert row["approx_p90"] in values

"""Two-input and pattern operators on the real runtime, against brute-force references."""

from __future__ import annotations

import json
import random

import pytest

import pescheduler
from pescheduler import Application

pytestmark = pytest.mark.integration


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_window_join_of_two_streams_across_workers(cluster, tmp_path):
    rng = random.Random(3)
    left = [{"k": rng.randrange(5), "a": i, "ts": i * 10} for i in range(400)]
    right = [{"k": rng.randrange(5), "b": i, "ts": i * 10 + rng.randrange(-30, 30)} for i in range(400)]
    right.sort(key=lambda e: e["ts"])
    out = tmp_path / "pairs.jsonl"
    app = Application("join")
    lhs = app.source("iterable", items=left)
    rhs = app.source("iterable", items=right)
    lhs.join(rhs, within=25, on="k").sink("jsonl", path=str(out))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        assert len({pe.worker for pe in dep.placement().pes.values()}) == 3
        status = dep.wait(timeout=120)
    assert status["late_events"] == 0
    got = sorted((r["left"]["a"], r["right"]["b"]) for r in read_jsonl(out))
    expected = sorted((l["a"], r["b"]) for l in left for r in right
                      if l["k"] == r["k"] and abs(l["ts"] - r["ts"]) <= 25)
    assert got == expected and len(got) > 50


def test_keyed_pattern_on_the_runtime(cluster, tmp_path):
    rng = random.Random(5)
    events = [{"k": rng.randrange(3), "a": rng.randrange(3), "ts": i} for i in range(3000)]
    out = tmp_path / "matches.jsonl"
    app = Application("pattern")
    (app.source("iterable", items=events).key_by("k")
        .pattern("x y", define={"x": lambda e, m: e["a"] == 0, "y": lambda e, m: e["a"] == 1},
                 do={"x": lambda e, m: {"k": e["k"], "first": e["ts"]}})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        dep.wait(timeout=120)
    expected = []
    for k in range(3):                                  # per key: an a=0 event directly followed by a=1
        seq = [e for e in events if e["k"] == k]
        expected += [(k, x["ts"], y["ts"]) for x, y in zip(seq, seq[1:]) if x["a"] == 0 and y["a"] == 1]
    got = sorted((r["k"], r["first"], r["ts"]) for r in read_jsonl(out))
    assert got == sorted(expected) and len(got) > 100

"""A pescheduler.ep processor compiled to an Application and deployed on a real LocalCluster
gives the results it gives in-process; a bad event is dead-lettered with the field named."""

from __future__ import annotations

import json
import random

import pytest

import pescheduler
from pescheduler import ep

pytestmark = pytest.mark.integration

WAIT = 120          # seconds: a bound on every wait


def build(out_dir):
    """Queries of every kind; each writes its results to ``out_dir/<query>.jsonl``."""
    def writer(path):
        def write(row):
            with open(path, "a") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
        return write

    proc = ep.EventProcessor()
    for name in ("s", "t"):
        proc.register_stream(name, {"id": str, "a": int, "b": int}, max_delay=50)
    window = ep.Sliding(100, 50)
    queries = {
        "filter": ep.Stream("s").filter(lambda e: e["a"] - e["b"] == 1),
        "mean": ep.Stream("s", window=window, key="id").aggregate({"m": ("avg", "a")}),
        "spread": ep.Stream("s", window=window, key="id").aggregate({"m": ("avg", "a"), "sd": ("stddev", "a")}),
        "correlate": ep.Stream("s", window=ep.Tumbling(20)).correlate("t", lambda l, r: l["a"] - r["b"] == 2),
        # of one shape: one ep_correlate with shared buffers, and one ep_patterns automaton
        "near": ep.Stream("s", window=ep.Tumbling(20)).correlate("t", ep.left("a") - ep.right("b") == 2),
        "near3": ep.Stream("s", window=ep.Tumbling(10)).correlate("t", ep.left("a") - ep.right("b") == 3),
        "rise": ep.Stream("s", window=ep.Tumbling(30), key="id").pattern(
            "x y", {"x": True, "y": ep.col("a") - ep.measure("z") == 1}, do={"x": {"z": ep.col("a")}}),
        "pattern": ep.Stream("s", window=ep.Tumbling(30), key="id").pattern(
            "x y", {"x": lambda e, m: True, "y": lambda e, m: e["a"] - m["z"] == 1},
            do={"x": lambda e, m: {"z": e["a"]}}),
    }
    for query_id, definition in queries.items():
        proc.create_query(query_id, definition)
        proc.add_output_processor(query_id, writer(str(out_dir / f"{query_id}.jsonl")))
    return proc, list(queries)


def results(out_dir, queries):
    found = {}
    for q in queries:
        path = out_dir / f"{q}.jsonl"
        found[q] = sorted(path.read_text().splitlines()) if path.exists() else []
    return found


def test_deployed_application_equals_in_process(cluster, tmp_path):
    rnd = random.Random(5)
    streams = {name: [({"id": f"k{rnd.randint(0, 3)}", "a": rnd.randint(0, 5), "b": rnd.randint(0, 5)}, i)
                      for i in range(1500)] for name in ("s", "t")}
    bad = ({"id": "k0", "a": "oops", "b": 1}, 700)
    streams["s"].insert(700, bad)

    (tmp_path / "embedded").mkdir()
    (tmp_path / "deployed").mkdir()
    embedded, queries = build(tmp_path / "embedded")
    for name, events in streams.items():
        for payload, ts in events:
            try:
                embedded.push_event(name, payload, ts)
            except ep.SchemaError as exc:
                assert (payload, ts) == bad and "field 'a' must be int" in str(exc)
    embedded.close()

    deployed, _ = build(tmp_path / "deployed")
    app = deployed.application("ep-deployed", sources=streams)
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        status = dep.wait(timeout=WAIT)
        dead = dep.dead_letters()
    assert status["state"] == "finished"
    assert [d["item"] for d in dead] == [{**bad[0], "ts": bad[1]}]
    assert "field 'a' must be int, got str 'oops'" in dead[0]["error"]
    expected = results(tmp_path / "embedded", queries)
    assert all(expected.values())                       # every query produced something
    assert results(tmp_path / "deployed", queries) == expected

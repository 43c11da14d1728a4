"""The shared pattern queries (``ep_patterns``), the over-window lanes (``ep_over``) and the
changelog aggregate, each copied and released
on a real Dask deployment while tuples flow, with their state in either keyed state backend (on
``disk``: a RocksDB store per instance, on its worker): the output is exactly the in-process
run's (patterns, lanes) or the table's aggregates from scratch (changelog), each row once.

The source holds its last tuples until the test has applied the Replicate and the Release, so
both happen mid-stream however slow the machine; the key groups move with their keys' runs
(patterns; a key's windows of every lane), with their waiting events, or their groups' aggregates and versions (changelog).
"""

from __future__ import annotations

import json

import pytest
from support_ops import copy_holds
from test_keyed_state_deploy import stores       # the operator stores under pescheduler.state.dir
from test_process_copies import killed_and_restored, replicated_and_released, tuples_in

import pescheduler
from pescheduler import Application, ep
from pescheduler.operators import OverLanes, SharedPatterns
from pescheduler.testing import run_operators

pytestmark = pytest.mark.integration

COUNT, KEYS, RATE = 12_000, 20, 2_000
QUERIES = {f"q{i}": {"pattern": "x y u", "within": 100 + 10 * i,
                     "define": {"x": True, "y": ep.col("a") - ep.measure("z1") == i,
                                "u": ep.col("a") - ep.measure("z2") == i},
                     "do": {"x": {"z1": ep.col("a")}, "y": {"z2": ep.col("a")}}} for i in range(3)}


def with_a(t: dict) -> dict:
    """A numbers tuple with a field ``a`` in 0..4 that varies along each key."""
    return {**t, "a": t["n"] * t["n"] // 7 % 5}


def change(t: dict) -> dict:
    """A numbers tuple as a change of one of 60 rows: an update (an insert when new) that may move
    the row to another of 16 regions, or a delete."""
    n, i = t["n"], t["n"] % 60
    r = n * 7919 % 97
    if r < 20:
        return {"op": "delete", "id": i, "before": {"id": i}, "after": None, "ts": t["ts"]}
    return {"op": "update", "id": i, "after": {"id": i, "region": f"r{r % 16}", "qty": r}, "ts": t["ts"]}


def deployed(app: Application, op: str, tmp_path, monkeypatch, backend: str, release) -> None:
    """Deploy ``app`` on two workers, Replicate and Release ``op`` mid-stream, wait for the end; on
    ``disk`` ``op``'s state is in a store of its own while it runs, removed with the deployment."""
    where = tmp_path / "stores"
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(where))       # the forked workers' setting
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state=backend) as dep:
        if backend == "disk":
            tuples_in(dep, op)
            assert [d for d in stores(where) if f"-{op}-" in d], stores(where)
        status = replicated_and_released(dep, op, release)
    assert status["state"] == "finished", status
    assert stores(where) == []


def numbers(app: Application, hold: str | None):
    held = {} if hold is None else copy_holds(hold, COUNT)
    return app.source("numbers", count=COUNT, keys=KEYS, rate=RATE, **held)


def patterns_app(app: Application, out, hold: str | None = None) -> None:
    (numbers(app, hold).map(with_a).key_by("key").apply("ep_patterns", key="key", queries=QUERIES, id="patterns")
        .map(lambda qr: {"q": qr[0], **qr[1]}).sink("jsonl", path=str(out)))


def assert_patterns_reference(rows) -> None:
    got = sorted(map(json.dumps, rows))
    events = [with_a({"n": i, "key": i % KEYS, "ts": i}) for i in range(COUNT)]
    want = run_operators(events, SharedPatterns(key="key", queries=QUERIES), key_field="key").output
    want = sorted(json.dumps({"q": q, **row}) for q, row in want)
    assert len(want) > 500 and got == want


AGGS = {"n": "count", "total": ("sum", "qty"), "hi": ("max", "qty")}


def changelog_app(app: Application, out, hold: str | None = None) -> None:
    numbers(app, hold).map(change).key_by("id").latest().aggregate(AGGS, by="region", id="totals").sink(
        "jsonl", path=str(out))


def assert_changelog_reference(rows: list) -> None:
    state, versions = {}, {}
    for r in rows:                           # each group's versions 1, 2, ...: every row once, in order
        assert r["version"] == versions.get(r["region"], 0) + 1, r
        versions[r["region"]] = r["version"]
        if r["op"] == "delete":
            del state[r["region"]]
        else:
            state[r["region"]] = (r["n"], r["total"], r["hi"])
    table: dict = {}
    for c in map(change, ({"n": i, "ts": i} for i in range(COUNT))):
        table.pop(c["id"], None) if c["op"] == "delete" else table.__setitem__(c["id"], c["after"])
    want: dict = {}
    for row in table.values():
        want.setdefault(row["region"], []).append(row["qty"])
    assert state == {g: (len(q), sum(q), max(q)) for g, q in want.items()} and len(versions) == 16


LANES = {50: {"c50": {"n": "count"}}, 80: {"c80": {"n": "count"}, "s80": {"total": ("sum", "a")}},
         60: {"s60": {"total": ("sum", "a"), "n": "count"}}, 40: {"m40": {"hi": ("max", "a")}}}


def lanes_app(app: Application, out, hold: str | None = None) -> None:
    (numbers(app, hold).map(with_a).key_by("key").apply("ep_over", key="key", lanes=LANES, id="lanes")
        .map(lambda qr: {"q": qr[0], **qr[1]}).sink("jsonl", path=str(out)))


def assert_lanes_reference(rows) -> None:
    got = sorted(map(json.dumps, rows))
    events = [with_a({"n": i, "key": i % KEYS, "ts": i}) for i in range(COUNT)]
    want = run_operators(events, OverLanes(key="key", lanes=LANES), key_field="key").output
    want = sorted(json.dumps({"q": q, **row}) for q, row in want)
    assert len(want) == 5 * COUNT and got == want


OPERATORS = [pytest.param("patterns", patterns_app, assert_patterns_reference, id="ep_patterns"),
             pytest.param("lanes", lanes_app, assert_lanes_reference, id="ep_over"),
             pytest.param("totals", changelog_app, assert_changelog_reference, id="changelog_aggregate")]


@pytest.mark.parametrize("backend", ["memory", "disk"])
@pytest.mark.parametrize("op, build, check", OPERATORS)
def test_copied_and_released_live_gives_every_row_once(tmp_path, monkeypatch, backend, op, build, check):
    out, release = tmp_path / "rows.jsonl", tmp_path / "release"
    app = Application(f"{op}-copies-{backend}")
    build(app, out, hold=str(release))
    deployed(app, op, tmp_path, monkeypatch, backend, release)
    check([json.loads(line) for line in out.read_text().splitlines()])


@pytest.mark.parametrize("op, build, check", OPERATORS)
def test_a_sigkilled_worker_restored_from_a_checkpoint_gives_every_row_once(tmp_path, monkeypatch, op, build, check):
    out = tmp_path / "rows.jsonl"
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path / "stores"))
    app = Application(f"ep-state-recovery-{op}")
    build(app, out)
    check(killed_and_restored(app, op, tmp_path, out, state="disk"))

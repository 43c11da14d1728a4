"""End to end on a real LocalCluster: exact output, fusion variants, errors, stop, flow control."""

from __future__ import annotations

import json
import os
import signal

import pytest

import pescheduler
from pescheduler import Application, DeploymentFailed, config
from support_ops import slow_consumer

pytestmark = pytest.mark.integration

EVENTS = 60_000
WAIT = 120          # seconds: a bound on every wait, never a sleep


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def by_key(rows, *fields):
    return sorted(rows, key=lambda r: tuple(r[f] for f in fields))


def cars_app(path, events=EVENTS):
    import connected_cars

    return connected_cars.build(events=events, output=str(path))


@pytest.fixture(scope="module")
def cars_reference():
    import connected_cars

    return by_key(connected_cars.reference(EVENTS), "window_start", "car")


def test_connected_cars_on_three_workers_equals_reference(cluster, tmp_path, cars_reference):
    out = tmp_path / "avg.jsonl"
    with pescheduler.deploy(cars_app(out), cluster=cluster, policies=[]) as dep:
        assert len({pe.worker for pe in dep.placement().pes.values()}) == 3
        status = dep.wait(timeout=WAIT)
    assert status["state"] == "finished"
    assert by_key(read_jsonl(out), "window_start", "car") == cars_reference


def test_fully_fused_gives_the_same_output(tmp_path, cars_reference):
    out = tmp_path / "avg.jsonl"
    with pescheduler.deploy(cars_app(out), workers=1, policies=[]) as dep:
        assert len(dep.placement().pes) == 1
        dep.wait(timeout=WAIT)
    assert by_key(read_jsonl(out), "window_start", "car") == cars_reference


def test_keyed_state_and_order_kept_across_channels(cluster, tmp_path):
    app = Application("running")
    out = tmp_path / "sums.jsonl"
    (app.source("numbers", count=20_000, keys=7)
        .apply("tag").key_by("key").apply("running_sum").sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        dep.wait(timeout=WAIT)
    rows = read_jsonl(out)
    assert [r["n"] for r in rows] == list(range(20_000))          # order kept, nothing lost or doubled
    expected = {}
    for r in rows:
        expected[r["key"]] = expected.get(r["key"], 0) + r["n"]
        assert r["sum"] == expected[r["key"]]


def test_operator_raising_on_a_tuple_dead_letters_it_and_streams_on(cluster, tmp_path):
    app = Application("raising")
    out = tmp_path / "out.jsonl"
    (app.source("iterable", items=[{"x": i, "ts": i} for i in range(1000)])
        .map(lambda t: {**t, "inv": 1 / (t["x"] % 100)})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        status = dep.wait(timeout=WAIT)
        dead = dep.dead_letters()
    assert sorted(t["x"] for t in read_jsonl(out)) == [i for i in range(1000) if i % 100]
    assert status["dead_letters"] == 10
    assert sorted(d["item"]["x"] for d in dead) == list(range(0, 1000, 100))
    assert all("ZeroDivisionError" in d["error"] and d["op"] == "map-2" for d in dead)


def test_unpicklable_tuple_is_dead_lettered_at_the_channel(cluster, tmp_path):
    app = Application("unpicklable")
    out = tmp_path / "out.jsonl"
    app.source("numbers", count=1000).apply("unpicklable", every=100).sink("jsonl", path=str(out))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        assert len(dep.placement().pes) == 3       # every edge crosses a channel
        dep.wait(timeout=WAIT)
        dead = dep.dead_letters()
    assert sorted(t["n"] for t in read_jsonl(out)) == [i for i in range(1000) if i % 100]
    assert len(dead) == 10 and all("lock" in d["error"] for d in dead)


def test_callback_failure_fails_the_deployment_with_the_reason(cluster, tmp_path):
    app = Application("explodes")
    app.source("numbers", count=5000).apply("explode", after=100).sink("jsonl", path=str(tmp_path / "o"))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        with pytest.raises(DeploymentFailed, match="explode-2.on_watermark raised SystemError: explode: on purpose"):
            dep.wait(timeout=WAIT)
        assert dep.status()["state"] == "failed"


def test_killed_worker_fails_the_deployment(tmp_path):
    app = Application("killed")
    (app.source("generator", events=None, keys=100, rate=2000)
        .sink("jsonl", path=str(tmp_path / "o.jsonl")))
    with pescheduler.deploy(app, workers=2, policies=[]) as dep:
        sink_worker = dep.placement().pes["jsonl-2"].worker
        os.kill(dep.worker_info[sink_worker]["pid"], signal.SIGKILL)
        with pytest.raises(DeploymentFailed, match="lost worker"):
            dep.wait(timeout=WAIT)


def test_stop_drains_an_unbounded_stream_and_flushes_windows(cluster, tmp_path):
    app = Application("unbounded")
    out = tmp_path / "win.jsonl"
    (app.source("generator", events=None, keys=5, rate=20_000, interval_ms=10)
        .key_by("car").window(size="1s", aggregates={"n": ("count", "speed")})
        .sink("jsonl", path=str(out)))
    dep = pescheduler.deploy(app, cluster=cluster, policies=[])
    try:
        dep.wait(timeout=1.0)
    except TimeoutError:
        pass                                    # still running, as an unbounded stream should
    status = dep.stop()
    assert status["state"] in ("finished", "stopped")
    rows = read_jsonl(out)
    assert rows, "stop must fire the open windows"
    generated = sum(r["n"] for r in rows)
    assert generated >= 1000


def test_slow_consumer_is_backpressured_and_memory_stays_bounded(cluster, tmp_path):
    app = Application("slow")
    app.source("numbers", count=30_000).map(slow_consumer(0.0001)).sink("jsonl", path=str(tmp_path / "o.jsonl"))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        dep.wait(timeout=WAIT)
        pes = {row["pe"]: row for row in dep.status()["pes"]}
    credits = config.get("channel.credits")
    assert pes["numbers-1"]["backpressure_s"] > 1.0            # the source waited for credit
    assert 1 <= pes["map-2"]["max_queue_batches"] <= credits   # never more than the credit window
    assert len(read_jsonl(tmp_path / "o.jsonl")) == 30_000


def test_two_deployments_share_a_cluster(cluster, tmp_path):
    apps = []
    for i in range(2):
        app = Application(f"twin-{i}")
        app.source("numbers", count=5000).apply("tag", tag=str(i)).sink("jsonl", path=str(tmp_path / f"{i}.jsonl"))
        apps.append(app)
    deps = [pescheduler.deploy(a, cluster=cluster, plugins=["support_ops"], policies=[]) for a in apps]
    try:
        for d in deps:
            d.wait(timeout=WAIT)
    finally:
        for d in deps:
            d.stop()
    for i in range(2):
        rows = read_jsonl(tmp_path / f"{i}.jsonl")
        assert sorted(r["n"] for r in rows) == list(range(5000)) and {r["tag"] for r in rows} == {str(i)}


def test_aggregate_from_a_plugin_module_reaches_the_workers(cluster, tmp_path):
    from pescheduler.plugins import activate

    activate(["support_ops"])          # as `--plugin support_ops` does before loading app.py
    app = Application("spread")
    out = tmp_path / "spread.jsonl"
    (app.source("numbers", count=3000, keys=3)
        .key_by("key").window(size=1000, aggregates={"spread": ("spread", "n")}).sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        dep.wait(timeout=WAIT)
    expected = {}
    for n in range(3000):                                   # ts = n ms, key = n % 3
        lo, hi = expected.get((n // 1000, n % 3), (n, n))
        expected[(n // 1000, n % 3)] = (min(lo, n), max(hi, n))
    assert {(r["window_start"] // 1000, r["key"]): r["spread"] for r in read_jsonl(out)} == \
        {k: hi - lo for k, (lo, hi) in expected.items()}

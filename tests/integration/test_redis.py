"""The Redis Streams source and sink against a real redis-server (started by the fixture).

Exact output through Redis, streams spread over source copies and gathered on
release without loss or doubling, resuming from a saved position, and the
bad-input cases (unreachable server, an entry that does not decode).
"""

from __future__ import annotations

import json
import time

import pytest

import pescheduler
from pescheduler import Application, Release, Replicate
from pescheduler.operator import OperatorContext

from brokers import fails_fast, output_and_dead_letters, start_redis, steady_port
from waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.broker]

WAIT = 60


@pytest.fixture(scope="module")
def redis_url():
    with start_redis() as broker:
        yield f"redis://{broker.address}/0"


@pytest.fixture
def client(redis_url):
    import redis

    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def fill(client, stream: str, numbers) -> None:
    pipe = client.pipeline(transaction=False)
    for i in numbers:
        pipe.xadd(stream, {"data": json.dumps({"n": i, "ts": 1_700_000_000_000 + i})})
    pipe.execute()


def output(client, stream: str, expect: int) -> list:
    try:
        until(lambda: client.xlen(stream) >= expect, WAIT, f"{expect} entries in {stream}")
    except AssertionError as exc:
        got = sorted(json.loads(f[b"data"])["n"] for _id, f in client.xrange(stream))
        missing = sorted(set(range(expect)) - set(got))
        raise AssertionError(f"{exc}: {len(got)} there, {len(got) - len(set(got))} doubled, "
                             f"missing {missing[:20]}{'...' if len(missing) > 20 else ''}") from None
    return [json.loads(fields[b"data"]) for _id, fields in client.xrange(stream)]


def test_redis_to_redis_every_entry_once(redis_url, client, cluster):
    fill(client, "exact-in", range(2000))
    app = Application("redis-exact")
    (app.source("redis", stream="exact-in", url=redis_url, event_time="ts")
        .map(lambda t: {**t, "double": 2 * t["n"]})
        .sink("redis", stream="exact-out", url=redis_url))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        out = output(client, "exact-out", 2000)
        dep.stop()
    assert sorted(r["n"] for r in out) == list(range(2000))
    assert all(r["double"] == 2 * r["n"] for r in out)


def test_streams_spread_over_copies_and_gather_on_release(redis_url, client, cluster):
    streams = ["spread-a", "spread-b", "spread-c"]
    for k, s in enumerate(streams):
        fill(client, s, range(k, 4500, 3))
    app = Application("redis-spread")
    (app.source("redis", stream=streams, url=redis_url, rate=1500, event_time="ts")
        .sink("redis", stream="spread-out", url=redis_url))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        until(lambda: _read_by(dep, "redis-1") > 0, WAIT, "the source reads")
        rec = dep.apply(Replicate("redis-1", 1))
        assert rec.applied, rec.reason
        until(lambda: _read_by(dep, "redis-1#1") > 0, WAIT, "the copy reads")
        rec = dep.apply(Release("redis-1", 1))
        assert rec.applied, rec.reason
        out = output(client, "spread-out", 4500)
        dep.stop()
    assert sorted(r["n"] for r in out) == list(range(4500)), "an entry lost or doubled"


def _read_by(dep, op: str) -> int:
    m = dep.snapshot().operators.get(op)
    return m.tuples_out if m else 0


def read_rest(source, expect: int) -> list:
    """Read until ``expect`` entries came (bounded by WAIT)."""
    got: list = []
    deadline = time.monotonic() + WAIT
    while len(got) < expect and time.monotonic() < deadline:
        got += source.read(64)
    return got


def test_seek_to_a_position_resumes_after_the_last_entry(redis_url, client):
    from pescheduler.operators.redis_streams import RedisStreamSource

    fill(client, "seek-a", range(0, 300, 2))
    fill(client, "seek-b", range(1, 300, 2))
    first = RedisStreamSource(stream=["seek-a", "seek-b"], url=redis_url)
    first.open(OperatorContext("redis-1"))
    head = first.read(100)
    saved = json.loads(json.dumps(first.position()))
    first.close()
    second = RedisStreamSource(stream=["seek-a", "seek-b"], url=redis_url)
    second.seek(saved)
    second.open(OperatorContext("redis-1"))
    tail = read_rest(second, 300 - len(head))
    second.close()
    assert sorted(t["n"] for t in head + tail) == list(range(300))


def test_lag_counts_the_entries_behind_per_stream(redis_url, client):
    """Against the real server: counted from the start, as the source reads, as entries arrive,
    after a seek into the middle (unknown until it catches up), and refused after deletions ahead."""
    import dask

    from pescheduler.operators.redis_streams import RedisStreamSource

    fill(client, "lag-a", range(200))
    fill(client, "lag-b", range(200))
    with dask.config.set({"pescheduler.monitor.interval": "0s"}):     # XINFO on every read: exact figures
        src = RedisStreamSource(stream=["lag-a", "lag-b"], url=redis_url)
        src.open(OperatorContext("redis-1"))
        assert len(src.read(50)) == 100 and src.lag() == {"lag-a": 150, "lag-b": 150}
        fill(client, "lag-a", range(200, 210))
        assert len(src.read(50)) == 100 and src.lag() == {"lag-a": 110, "lag-b": 100}
        saved = src.position()
        src.close()
        again = RedisStreamSource(stream=["lag-a", "lag-b"], url=redis_url)
        again.seek(saved)
        again.open(OperatorContext("redis-1"))
        read = len(again.read(10))
        assert read == 20 and again.lag() == {}      # mid-stream after a seek: nobody can tell yet
        deadline = time.monotonic() + WAIT
        while read < 210 and time.monotonic() < deadline:
            read += len(again.read(100))
        assert read == 210 and again.read(100) == [] and again.lag() == {"lag-a": 0, "lag-b": 0}
        fill(client, "lag-b", range(5))
        again.read(2)
        assert again.lag() == {"lag-a": 0, "lag-b": 3}
        ahead = [entry_id for entry_id, _ in client.xrange("lag-b")][-1]
        client.xdel("lag-b", ahead)                  # deleted before being read: it would be counted
        again.read(1)
        assert again.lag() == {"lag-a": 0}
        again.close()


def test_lag_is_in_the_snapshot_and_in_status(redis_url, client, cluster):
    fill(client, "lag-in", range(20_000))
    app = Application("redis-lag")
    app.source("redis", stream="lag-in", url=redis_url, rate=500).sink("discard")
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        until(lambda: sum(dep.snapshot().operators["redis-1"].lag.values()) > 0
              if "redis-1" in dep.snapshot().operators else False, WAIT, "lag reported")
        lag = dep.snapshot().operators["redis-1"].lag
        assert set(lag) == {"lag-in"} and 15_000 < lag["lag-in"] <= 20_000
        row = next(o for o in dep.status()["operators"] if o["op"] == "redis-1")
        assert set(row["lag"]) == {"lag-in"} and row["lag"]["lag-in"] <= lag["lag-in"]
        until(lambda: dep.next_snapshot(timeout=WAIT).operators["redis-1"].lag_per_s < 0, WAIT,
              "the lag trend shows it draining")
        dep.stop()


def test_the_union_of_shared_instances_positions_seeks_one_fresh_instance(redis_url, client):
    """Each copy's position covers its own streams; their union resumes a single fresh instance."""
    import msgpack

    from pescheduler.operator import Share
    from pescheduler.operators.redis_streams import RedisStreamSource

    names = ["union-a", "union-b", "union-c"]
    for k, name in enumerate(names):
        fill(client, name, range(k, 300, 3))
    heads, saved = [], {}
    for i in range(2):
        copy = RedisStreamSource(stream=names, url=redis_url)
        copy.restore({"positions": {}, "max_ts": {}, "share": Share(i, 2)})
        copy.open(OperatorContext("redis-1"))
        heads += copy.read(40)
        part = copy.position()
        assert set(part) == ({"union-a", "union-c"} if i == 0 else {"union-b"})
        saved.update(part)
        copy.close()
    stored = msgpack.unpackb(msgpack.packb(json.loads(json.dumps(saved))))
    assert stored == saved
    single = RedisStreamSource(stream=names, url=redis_url)
    single.seek(stored)
    single.open(OperatorContext("redis-1"))
    tail = read_rest(single, 300 - len(heads))
    assert single.read(64) == []
    single.close()
    assert sorted(t["n"] for t in heads + tail) == list(range(300)), "lost or doubled across the seek"


def test_unreachable_server_fails_naming_the_url(cluster):
    app = Application("redis-unreachable")
    app.source("redis", stream="x", url="redis://127.0.0.1:1/0", connect_timeout="2s").sink("discard")
    fails_fast(app, cluster, "redis://127.0.0.1:1/0")


def test_an_unreachable_servers_password_is_in_no_error_status_or_published_status(cluster):
    """A Redis URL's password never reaches the error, the status or the scheduler's metadata."""
    from distributed import Client

    from pescheduler.errors import DeploymentFailed

    app = Application("redis-secret")
    app.source("redis", stream="x", url="redis://:hunter2@127.0.0.1:1/0", connect_timeout="2s").sink("discard")
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        with pytest.raises(DeploymentFailed) as failed:
            dep.wait(timeout=60)
        status = json.dumps(dep.status())
        with Client(cluster, timeout=30) as scheduler:
            published = json.dumps(scheduler.get_metadata(["pescheduler", "deployments"], default={}), default=str)
    assert "redis://:***@127.0.0.1:1/0" in str(failed.value)
    for text in (str(failed.value), status, published):
        assert "hunter2" not in text


def test_an_entry_that_does_not_decode_is_dead_lettered_with_its_id(redis_url, client, cluster):
    fill(client, "bad-in", range(5))
    bad_id = client.xadd("bad-in", {"data": b"{not json"}).decode()
    fill(client, "bad-in", range(5, 10))
    app = Application("redis-bad")
    app.source("redis", stream="bad-in", url=redis_url).sink("redis", stream="bad-out", url=redis_url)
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        out = output(client, "bad-out", 10)
        until(lambda: dep.dead_letters(), WAIT, "the dead letter")
        dead = dep.dead_letters()
        dep.stop()
    assert sorted(r["n"] for r in out) == list(range(10))
    assert len(dead) == 1 and dead[0]["item"]["id"] == bad_id and dead[0]["item"]["stream"] == "bad-in"


def test_entries_without_a_valid_event_time_are_dead_letters_and_the_rest_flows(redis_url, client, cluster):
    """A missing, None, text or NaN ``event_time`` field: a dead letter each, with the reason."""
    fill(client, "badts-in", range(50))
    for bad in ({"n": -1}, {"n": -2, "ts": None}, {"n": -3, "ts": "noon"}, {"n": -4, "ts": float("nan")}):
        client.xadd("badts-in", {"data": json.dumps(bad)})
    fill(client, "badts-in", range(50, 100))
    app = Application("redis-badts")
    app.source("redis", stream="badts-in", url=redis_url, event_time="ts").sink("redis", stream="badts-out",
                                                                                url=redis_url)
    out, dead, status = output_and_dead_letters(app, cluster, lambda: output(client, "badts-out", 100), 4)
    assert sorted(r["n"] for r in out) == list(range(100))
    assert status["dead_letters"] == 4
    assert sorted(json.loads(d["item"]["fields"][b"data"])["n"] for d in dead) == [-4, -3, -2, -1]
    assert all("event time" in d["error"] for d in dead), dead


def test_with_checkpoints_a_killed_sink_worker_loses_and_repeats_nothing(redis_url, client, tmp_path):
    """Redis source → map → redis sink under checkpoints, the sink's worker SIGKILLed mid-stream:
    the stream holds every entry once (staged per epoch, moved in by one script per commit)."""
    import os
    import signal

    n = 12_000
    fill(client, "eos-in", range(n))
    app = Application("redis-eos")
    (app.source("redis", stream="eos-in", url=redis_url, event_time=None, rate=2_000)
        .map(lambda t: {"n": t["n"], "twice": 2 * t["n"]}, id="twice")
        .sink("redis", stream="eos-out", url=redis_url))
    with pescheduler.deploy(app, workers=3, policies=[], checkpoint=str(tmp_path / "ckpt"),
                            checkpoint_interval="0.5s") as dep:
        until(lambda: len(dep.checkpoints()) >= 2, WAIT, "two complete checkpoints")
        assert client.xlen("eos-out") < n, "killed after everything was written"
        placement = dep.placement()
        os.kill(dep.worker_info[placement.pes[placement.pe_of("redis-3")].worker]["pid"], signal.SIGKILL)
        read_after_a_restart(dep, "eos-in")
        dep.stop()
    assert_every_entry_once(client, "eos-out", n)


def read_after_a_restart(dep, stream: str) -> None:
    """Until a restart has had output after it and the source has read the whole of ``stream``."""
    until(lambda: dep.recovery.restarts and "first_output_s" in dep.recovery.restarts[-1], WAIT,
          "a restart with output after it")
    until(lambda: dep.snapshot().operators.get("redis-1") is not None
          and dep.snapshot().operators["redis-1"].lag == {stream: 0}, WAIT, "the whole stream read")


def assert_every_entry_once(client, stream: str, n: int) -> None:
    """``stream`` holds ``{"n", "twice"}`` for every ``n`` below ``n`` once, and no staging is left."""
    out = [json.loads(f[b"data"]) for _id, f in client.xrange(stream)]
    assert sorted(r["n"] for r in out) == list(range(n)), "an entry lost or doubled"
    assert all(r["twice"] == 2 * r["n"] for r in out)
    assert not list(client.scan_iter(match=f"{{{stream}}}:pescheduler-staging:*")), "staging left behind"


def test_sink_copies_replicated_released_and_restored_onto_fewer_hand_over_their_staging(redis_url, client,
                                                                                          tmp_path):
    """The redis sink under checkpoints replicated, its copy released mid-epoch, replicated again
    (the same copy id) and the copy's worker SIGKILLed, the restore placing one sink instance
    where the checkpoint had two: what a copy staged is handed to the original and published
    with its commits. Every entry once, and no staging list left behind."""
    import os
    import signal

    def last_checkpoint() -> int:
        done = dep.checkpoints()
        return done[-1]["id"] if done else 0

    def checkpoints_after(count: int) -> None:
        now = last_checkpoint()
        until(lambda: last_checkpoint() >= now + count, WAIT, f"{count} more complete checkpoints")

    n = 15_000
    fill(client, "copies-in", range(n))
    app = Application("redis-sink-copies")
    (app.source("redis", stream="copies-in", url=redis_url, event_time=None, rate=800)
        .map(lambda t: {"n": t["n"], "twice": 2 * t["n"]}, id="twice")
        .sink("redis", stream="copies-out", url=redis_url, id="out"))
    with pescheduler.deploy(app, workers=3, policies=[], checkpoint=str(tmp_path / "ckpt"),
                            checkpoint_interval="0.5s") as dep:
        checkpoints_after(1)
        for step in ("replicate", "release", "replicate"):
            rec = dep.apply(Replicate("out", 1) if step == "replicate" else Release("out", 1))
            assert rec.applied, f"{step}: {rec.reason}"
            if step == "replicate":
                until(lambda: (dep.snapshot().operators.get("out#1") or _Zero).tuples_in > 0, WAIT,
                      "the sink's copy writes")
            checkpoints_after(2)
        assert client.xlen("copies-out") < n, "killed after everything was written"
        os.kill(dep.worker_info[dep.placement().pes["out#1"].worker]["pid"], signal.SIGKILL)
        read_after_a_restart(dep, "copies-in")
        assert dep.placement().instances("out") == ["out"], "restored onto as many sink instances"
        dep.stop()
    assert_every_entry_once(client, "copies-out", n)


class _Zero:
    tuples_in = 0


def test_a_redis_killed_and_started_again_mid_stream_costs_restores_not_entries(tmp_path):
    """Issue 31, findings 2 and 4: the sink's Redis (append-only, fsync always) SIGKILLed by PID
    between checkpoints and started again 5 s later on its files. The sink's writes and commits
    fail meanwhile: its PE fails (no batch re-run tuple by tuple, nothing dead-lettered, no
    staged epoch forgotten) and the run restores, with a growing pause, until Redis is back;
    the stream then holds every entry once. Before: the failed batches became dead letters and
    a failed commit forgot its epochs (entries missing, run 'finished')."""
    import redis

    n = 12_000
    broker = start_redis(port=steady_port(), folder=str(tmp_path), durable=True)   # started again on it
    url = f"redis://{broker.address}/0"
    app = Application("redis-outage")
    (app.source("numbers", count=n, keys=10, rate=2_000)
        .map(lambda t: {"n": t["n"], "twice": 2 * t["n"]})
        .sink("redis", stream="out", url=url))
    try:
        with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[],
                                checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.3s") as dep:
            until(lambda: len(dep.checkpoints()) >= 2, WAIT, "two complete checkpoints")
            broker.proc.kill()
            broker.proc.wait(timeout=10)
            time.sleep(5)                    # the outage's length (a fault, not a synchronisation)
            broker = start_redis(port=int(broker.address.rsplit(":", 1)[1]), folder=str(tmp_path), durable=True)
            status = dep.wait(timeout=WAIT)
            assert dep.dead_letters() == []
            assert status["checkpoints"]["restart"]["used"] >= 1
        client = redis.Redis.from_url(url)
        assert_every_entry_once(client, "out", n)
        client.close()
    finally:
        broker.stop()

"""Copies on standard slots, end to end: added and released mid-stream, output exact.

For each of STATELESS, KEYED and MERGEABLE, a paced source runs while a copy
of the middle operator is added, processes tuples, and is released; the
sinks must then hold exactly what an undisturbed run would (every number
once, keyed running sums exact and in per-key order, window counts exact).
"""

from __future__ import annotations

import json

import dask.config
import pytest

import pescheduler
from pescheduler import Application, Fuse, Release, Replicate, Split, config
from guarded import assert_drained, assert_exact
from support_ops import slow_consumer
from waiting import processed, snapshot_until

pytestmark = pytest.mark.integration

RATE = 20_000
WAIT = 60           # seconds: the bound on every wait


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def until(dep, predicate, what: str):
    """The first monitor snapshot for which ``predicate`` holds (bounded by WAIT)."""
    return snapshot_until(dep, predicate, WAIT, what)


def assert_every_number_once(rows):
    numbers = sorted(r["n"] for r in rows)
    assert numbers == list(range(len(numbers))), "a number is missing or doubled"
    assert len(numbers) > RATE // 2


def test_stateless_copy_takes_a_share_of_the_traffic_and_goes_without_loss(cluster, tmp_path):
    out = tmp_path / "tagged.jsonl"
    app = Application("copies-stateless")
    app.source("numbers", count=10**9, keys=5, rate=RATE).apply("tag").sink("jsonl", path=str(out))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        until(dep, processed("tag-2"), "tag-2 processes tuples")
        rec = dep.apply(Replicate("tag-2", 1))
        assert rec.applied, rec.reason
        copy = dep.placement().pes["tag-2#1"]
        assert copy.copy_of == "tag-2" and copy.worker != dep.placement().pes["tag-2"].worker
        first = until(dep, processed("tag-2#1"), "the copy processes tuples")
        last = dep.next_snapshot(timeout=WAIT)
        last = dep.next_snapshot(timeout=WAIT)
        share = {op: last.operators[op].tuples_in - first.operators[op].tuples_in for op in ("tag-2", "tag-2#1")}
        # STATELESS: whole batches by credit (plan/routing.py), so each instance takes what it has
        # room for; with credit to spare on both they alternate, and neither is starved
        total = share["tag-2"] + share["tag-2#1"]
        assert min(share.values()) >= 0.2 * total, share
        rec = dep.apply(Release("tag-2", 1))
        assert rec.applied, rec.reason
        assert "tag-2#1" not in dep.placement().pes
        assert all(not s.copies for s in dep.placement().slots.values())
        dep.next_snapshot(timeout=WAIT)
    rows = read(out)
    assert_every_number_once(rows)
    assert all(r["tag"] == "x" for r in rows)


def test_keyed_copy_takes_key_groups_with_their_state(cluster, tmp_path):
    out = tmp_path / "sums.jsonl"
    app = Application("copies-keyed")
    (app.source("numbers", count=10**9, keys=50, rate=RATE).key_by("key")
        .apply("running_sum").sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        until(dep, processed("running_sum-3"), "running_sum processes tuples")
        rec = dep.apply(Replicate("running_sum-3", 1))
        assert rec.applied, rec.reason
        until(dep, processed("running_sum-3#1"), "the copy processes tuples")
        rec = dep.apply(Release("running_sum-3", 1))
        assert rec.applied, rec.reason
        dep.next_snapshot(timeout=WAIT)
    rows = read(out)
    assert_every_number_once(rows)
    last, running = {}, {}
    for r in rows:                                # the sink's file order is arrival order
        assert r["n"] > last.get(r["key"], -1), f"key {r['key']} out of order at {r['n']}"
        last[r["key"]] = r["n"]
        running[r["key"]] = running.get(r["key"], 0) + r["n"]
        assert r["sum"] == running[r["key"]], f"state of key {r['key']} lost or doubled"


def test_mergeable_copy_partials_are_merged_by_the_original(cluster, tmp_path):
    out = tmp_path / "counts.jsonl"
    app = Application("copies-mergeable")
    (app.source("numbers", count=10**9, keys=5, rate=RATE)
        .apply("window_count", size=1000).sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        until(dep, processed("window_count-2"), "window_count processes tuples")
        rec = dep.apply(Replicate("window_count-2", 1))
        assert rec.applied, rec.reason
        until(dep, lambda s: processed("window_count-2#1")(s) and s.operators["window_count-2"].tuples_in > 0,
              "the copy counts tuples")
        rec = dep.apply(Release("window_count-2", 1))      # flushes its partials to the original
        assert rec.applied, rec.reason
        dep.next_snapshot(timeout=WAIT)
    rows = sorted(read(out), key=lambda r: r["window_start"])
    total = sum(r["count"] for r in rows)
    assert [r["window_start"] for r in rows] == [1000 * i for i in range(len(rows))]
    assert all(r["count"] == 1000 for r in rows[:-1]), [r for r in rows if r["count"] != 1000][:3]
    assert total > RATE // 2


def test_slots_are_warm_and_shown_and_a_cold_worker_starts_when_none_is_left(tmp_path):
    """Embedded cluster, 2 workers, 2 slots: the first copy goes to the warm slot off the hot
    operator's worker; the second finds none left and starts a worker (the cold path)."""
    out = tmp_path / "tagged.jsonl"
    app = Application("copies-cold")
    app.source("numbers", count=10**9, keys=5, rate=RATE).apply("tag").sink("jsonl", path=str(out))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[]) as dep:
        until(dep, processed("tag-2"), "tag-2 processes tuples")
        slots = dep.status()["slots"]
        assert [s["slot"] for s in slots] == ["slot-1", "slot-2"] and not any(s["copies"] for s in slots)
        warm = dep.apply(Replicate("tag-2", 1))
        assert warm.applied, warm.reason
        cold = dep.apply(Replicate("tag-2", 1))
        assert cold.applied, cold.reason
        assert len(dep.placement().workers) == 3
        assert any(e["kind"] == "cold-start" for e in dep.status()["events"])
        held = {s["slot"]: s["copies"] for s in dep.status()["slots"]}
        assert sorted(c for cs in held.values() for c in cs) == ["tag-2#1", "tag-2#2"]
        until(dep, lambda s: all(processed(c)(s) for c in ("tag-2#1", "tag-2#2")), "both copies work")
        assert dep.apply(Release("tag-2", 2)).applied
        dep.next_snapshot(timeout=WAIT)
    assert_every_number_once(read(out))


def router_fused_and_consumer_away(dep, op: str) -> None:
    """The router fused into ``op``'s PE, so a copy of ``op`` takes its key groups while the
    original runs on, and the consumer (map, sink) on the other worker, so the original's channel
    to it can hold a backlog."""
    pl = dep.placement()
    assert dep.apply(Fuse(pl.pe_of("key_by-2"), pl.pe_of(op)), timeout=WAIT).applied
    pl = dep.placement()
    pe = pl.pe_of(op)
    away = tuple(o for o in pl.pes[pe].operators if o.startswith(("map", "jsonl")))
    if away:
        other = next(w for w in pl.workers if w != pl.pes[pe].worker)
        assert dep.apply(Split(pe, away, worker=other), timeout=WAIT).applied


def test_a_copy_of_a_running_instance_keeps_each_keys_order_into_a_slow_consumer(cluster, tmp_path):
    """The router and the original run in one PE, so a copy takes its key groups while the
    original goes on (a deferred move), and the consumer downstream is slow: the original's
    output for the moved groups waits in its channel to the consumer. The copy's output for them
    goes on another channel into the same consumer, and must come after: before, the consumer
    took the copy's sums first (``a key's numbers out of order``, load 12)."""
    out = tmp_path / "sums.jsonl"
    app = Application("copies-ordered")
    (app.source("numbers", count=10**9, keys=7, rate=4_000).key_by("key").apply("running_sum")
        .map(slow_consumer(0.0003)).sink("jsonl", path=str(out)))     # ~3,300/s: it falls behind
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        router_fused_and_consumer_away(dep, "running_sum-3")
        rec = dep.apply(Replicate("running_sum-3", 1), timeout=WAIT)
        assert rec.applied, rec.reason
        assert any(s.startswith("moving") for s in rec.steps), rec.steps    # a deferred move: the live path
        until(dep, processed("running_sum-3#1"), "the copy processes tuples")
        assert dep.apply(Release("running_sum-3", 1), timeout=WAIT).applied
        assert_drained(dep.stop(drain_timeout=3 * WAIT))   # the slow consumer's backlog, whatever the load
    assert_exact(out)


def test_a_released_copys_last_batches_are_taken_by_a_slow_consumer_after_the_pause(cluster, tmp_path):
    """The copy's output into a slow consumer on the other worker holds a backlog when the copy is
    released: the pause waits until the copy's marker is queued at the consumer, behind its last
    batches, not until the consumer took them (session 21: 119 of a 166 ms Release at 10^6 keys
    on disk). The consumer takes the marker after the pause (the order wait), and only then do the
    copy's groups go back to the original, which holds their tuples meanwhile: exact and in
    per-key order. On main the pause's drain waited for the take (``drain map-4<-...``)."""
    out = tmp_path / "sums.jsonl"
    app = Application("copies-release-backlog")
    (app.source("numbers", count=10**9, keys=7, rate=4_000).key_by("key").apply("running_sum")
        .map(slow_consumer(0.0003)).sink("jsonl", path=str(out)))     # ~3,300/s: it falls behind
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        router_fused_and_consumer_away(dep, "running_sum-3")
        assert dep.apply(Replicate("running_sum-3", 1), timeout=WAIT).applied
        until(dep, processed("running_sum-3#1"), "the copy processes tuples")
        rec = dep.apply(Release("running_sum-3", 1), timeout=WAIT)
        assert rec.applied and rec.created == (), rec.as_dict()
        copy_out = [s for s in rec.steps if "<-running_sum-3#1" in s]
        assert [s for s in copy_out if s.startswith("drain ")] and all(
            s.endswith(" queued") for s in copy_out if s.startswith("drain ")), rec.steps   # queued in the pause
        assert [s for s in copy_out if s.startswith("order ")], rec.steps                   # taken after it
        assert rec.steps["moving: groups after the pause"] > 0, rec.steps
        assert_drained(dep.stop(drain_timeout=3 * WAIT))   # the slow consumer's backlog, whatever the load
    assert_exact(out)


def pause_steps(rec) -> list[str]:
    """The record's steps inside the pause: all but ``lock`` (or ``lock: <what held it>``), ``plan``,
    ``open`` and its parts (before it) and ``moving: ...`` (after it)."""
    return [s for s in rec.steps if s not in ("lock", "plan", "open") and not s.startswith(("lock: ", "open: ", "moving: "))]


def test_a_copys_deploy_and_channels_connect_before_the_pause(cluster, tmp_path):
    """A Replicate that leaves the original running deploys the copy and opens its channels (the
    router's new output to it, its output to the consumer) before the pause, with no data on them;
    the pause only switches the routes (h30p measured 44-143 ms of connects inside a loaded
    Replicate's pause). On main the copy's deploy and every connect are parts of the pause's
    ``deploy + start + rewire``. Exact and in per-key order across it (into a slow consumer)."""
    out = tmp_path / "sums.jsonl"
    app = Application("copies-open-early")
    (app.source("numbers", count=10**9, keys=7, rate=4_000).key_by("key").apply("running_sum")
        .map(slow_consumer(0.0003)).sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        router_fused_and_consumer_away(dep, "running_sum-3")
        rec = dep.apply(Replicate("running_sum-3", 1), timeout=WAIT)
        assert rec.applied and rec.retired == (), rec.as_dict()
        inside = pause_steps(rec)
        assert not [s for s in inside if s.startswith("deploy") or s.endswith(": connect")], rec.steps
        assert any(s.startswith("open: deploy running_sum-3#1") for s in rec.steps), rec.steps
        assert any(s.startswith("open: out ") and s.endswith(": connect") for s in rec.steps), rec.steps
        assert "switch" in rec.steps, rec.steps
        until(dep, processed("running_sum-3#1"), "the copy processes tuples")
        assert dep.apply(Release("running_sum-3", 1), timeout=WAIT).applied
        assert_drained(dep.stop(drain_timeout=3 * WAIT))   # the slow consumer's backlog, whatever the load
    assert_exact(out)


def test_a_released_copy_hands_its_queued_input_to_the_original_with_its_groups(cluster, tmp_path):
    """A copy slower than its input has a credit window queued when it is released: the tuples
    ahead of the marker go with its key groups (``worker/carried_input.py``), through the
    original's gate ahead of what the router sent it after the switch, instead of through the
    copy's operator in the pause (at 10^7 keys on disk that pass was 359-875 ms of a Release).
    The marker overtakes what the upstream still buffers for the copy (``protocol._overtakable``):
    that goes to the original's gate with the rest, so the copy carries at most the credit
    window its channel had shipped, not the upstream's backlog of it.
    Each key's running sums exact and in order, nothing lost or doubled."""
    out = tmp_path / "sums.jsonl"
    app = Application("copies-carried")
    (app.source("numbers", count=10**9, keys=7, rate=4_000).key_by("key")
        .apply("running_sum", seconds=0.001)         # ~1,000/s an instance: both behind their input
        .sink("jsonl", path=str(out)))
    with dask.config.set({"pescheduler.batch.size": 100}), \
            pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        assert dep.apply(Replicate("running_sum-3", 1), timeout=WAIT).applied
        until(dep, processed("running_sum-3#1"), "the copy processes tuples")
        rec = dep.apply(Release("running_sum-3", 1), timeout=WAIT)
        assert rec.applied, rec.reason
        window = config.get("channel.credits") * config.get("batch.size")     # 8 x the 100 set above
        carried = rec.steps.get("moving: tuples carried", 0)
        assert 0 < carried <= window, (f"the copy carried {carried} tuples (credit window {window}); "
                                       f"steps: {rec.steps}")
        assert_drained(dep.stop(drain_timeout=3 * WAIT))
    assert_exact(out)


def test_a_copy_waiting_for_its_groups_holds_at_most_what_the_setting_allows(cluster, tmp_path):
    """As above, at a source rate the consumer cannot follow: while the consumer works through the
    original's backlog (the copy's groups leave once it took the original's marker), the copy
    holds the tuples of its groups. It holds at most ``pescheduler.state.hold`` of them at once (here
    0: a credit window, the least), then takes no more input until they arrive (its upstream waits for
    credit, as behind a slow operator); before,
    it held all that came for as long as the backlog lasted (59,285 tuples in 12 s at
    20,000/s into 3,300/s). Nothing lost, doubled or reordered either way."""
    out = tmp_path / "sums.jsonl"
    app = Application("copies-held")
    (app.source("numbers", count=10**9, keys=7, rate=RATE).key_by("key").apply("running_sum")
        .map(slow_consumer(0.0003)).sink("jsonl", path=str(out)))     # ~3,300/s: it falls behind
    window = config.get("channel.credits") * config.get("batch.size")
    with dask.config.set({"pescheduler.state.hold": 0}), \
            pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:   # the credit window
        router_fused_and_consumer_away(dep, "running_sum-3")
        until(dep, processed("map-4"), "the consumer processes tuples")
        rec = dep.apply(Replicate("running_sum-3", 1), timeout=WAIT)
        assert rec.applied, rec.reason
        # the setting bounds what is held at once: as each group arrives its tuples go through and
        # more come in for the groups still on their way, so the sum over the move may pass it
        held = rec.steps["moving: most tuples held at once"]
        # what one turn takes past the bound: the copy's inbox, at most a credit window more
        assert held <= 2 * window, (f"the copy held {held} tuples of its groups at once (credit window "
                                    f"{window}); steps: {rec.steps}")
        assert_drained(dep.stop(drain_timeout=3 * WAIT))   # the slow consumer's backlog, whatever the load
    assert_exact(out)


def test_a_copy_of_a_running_window_keeps_each_keys_windows_in_order_into_a_slow_consumer(cluster, tmp_path):
    """The window is columnar, so its moves are not deferred: the copy is built from its key
    groups inside the reconfiguration and runs at once. With the router fused into the original,
    the original runs on and its fired windows for the moved keys may still wait in its channel
    to a slow consumer: the copy's later windows for a key must come after them.

    Batches of 100: each channel's backlog (a credit window shipped, two more buffered) and the
    tuples the original holds for the copy's groups until the consumer took the copy's last
    batches are then a tenth of what the default's 1,000 make, and ``stop()`` drains them all
    through the slow consumer. With 1,000 that drain was 20-46 s at six busy loops and outlasted
    its 180 s bound in the loaded suite (load 12), where the consumer's sleeps stretch."""
    out = tmp_path / "windows.jsonl"
    app = Application("copies-window-ordered")
    (app.source("numbers", count=10**9, keys=1000, rate=4_000).key_by("key")
        .window(size=1000, aggregates={"count": ("count", "n")})    # ts = n ms: 4,000 windows/s
        .map(slow_consumer(0.0005)).sink("jsonl", path=str(out)))    # ~1,800/s: it falls behind
    with dask.config.set({"pescheduler.batch.size": 100}), \
            pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        window = next(op for op in dep.placement().plan.ops if op.startswith("window"))
        router_fused_and_consumer_away(dep, window)
        until(dep, processed("map-4"), "the consumer processes windows")
        rec = dep.apply(Replicate(window, 1), timeout=WAIT)
        assert rec.applied, rec.reason
        until(dep, processed(f"{window}#1"), "the copy processes tuples")
        assert dep.apply(Release(window, 1), timeout=WAIT).applied
        assert_drained(dep.stop(drain_timeout=3 * WAIT))
    starts: dict = {}
    for row in read(out):
        seen = starts.setdefault(row["key"], [])
        assert not seen or row["window_start"] > seen[-1], (
            f"key {row['key']}: window {row['window_start']} after {seen[-1]} (out of order or doubled)")
        seen.append(row["window_start"])
    assert sum(len(s) for s in starts.values()) > 50

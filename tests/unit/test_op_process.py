"""Keyed process functions with timers against a plain-Python reference (support_ops.process_reference).

Streams are random and out of order within a bounded delay, cut into random batches, with a
watermark after each batch as a source makes it; the operator's output per key must equal the
reference's whatever the batching, and across snapshots split into copies and merged back.
"""

import time

import pytest
from hypothesis import given, settings, strategies as st

from pescheduler import Application
from pescheduler.errors import InvalidApplication
from pescheduler.operator import MAX_WATERMARK, Emitter, OperatorContext
from pescheduler.operators.process import Process
from pescheduler.state import key_group
from support_ops import Lapses, process_reference

DELAY = 30          # ms of out-of-orderness the watermark allows


@st.composite
def streams(draw):
    """Events ``{"key", "ts", "i"}`` whose ts lag the largest seen by at most DELAY (none late)."""
    n = draw(st.integers(1, 120))
    keys = draw(st.integers(1, 5))
    base = sorted(draw(st.lists(st.integers(0, 2000), min_size=n, max_size=n)))
    jitter = draw(st.lists(st.integers(0, DELAY), min_size=n, max_size=n))
    return [{"key": draw(st.integers(0, keys - 1)), "ts": b + j, "i": i}
            for i, (b, j) in enumerate(zip(base, jitter))]


def opened(op, key="key"):
    op.open(OperatorContext("process-1", key_field=key))
    return op


def feed(ops, events, cuts, owner=lambda k: 0):
    """Batches cut at ``cuts`` to the op owning each key, a watermark after each to every op; the
    outputs in order. ``ops`` may be replaced between batches by a callback in ``cuts``."""
    out, seen, start = [], -(2**62), 0
    for end in sorted(set(cuts)) + [len(events)]:
        batch = events[start:end]
        for index, op in enumerate(ops):
            emit = Emitter()
            op.process([e for e in batch if owner(e["key"]) == index], emit)
            out += emit
        seen = max([seen] + [e["ts"] for e in batch])
        out += watermark(ops, seen - DELAY - 1)
        start = end
    return out + watermark(ops, MAX_WATERMARK)


def watermark(ops, wm):
    out = []
    for op in ops:
        emit = Emitter()
        op.on_watermark(wm, emit)
        assert not emit.sides and not emit.dead, (emit.sides, emit.dead)
        out += emit
    return out


def held(op):
    """``{key: KeyRecord}`` the operator's keyed state holds."""
    return {k: r for g in op._keys.groups() for k, r in op._keys.items(g)}


def per_key(rows):
    got = {}
    for r in rows:
        got.setdefault(r["key"], []).append(r)
    return got


def expected(events, **kw):
    return {k: v for k, v in process_reference(Lapses(), events, **kw).items() if v}


@settings(max_examples=80, deadline=None)
@given(streams(), st.lists(st.integers(0, 120), max_size=8))
def test_timers_fire_in_timestamp_order_once_as_the_reference_whatever_the_batching(events, cuts):
    op = opened(Process(Lapses))
    assert per_key(feed([op], events, cuts)) == expected(events)
    records = held(op).values()
    assert all(r.state and not r.timers for r in records), "an empty key holds a record"


@settings(max_examples=60, deadline=None)
@given(streams(), st.integers(0, 120), st.integers(0, 120), st.integers(1, 3))
def test_split_and_merge_move_state_and_pending_timers_exactly_once(events, at, back, copies):
    """Run to ``at``, split the snapshot over ``copies`` + 1 instances by key, run to ``back``,
    merge them into one again, run to the end: every timer fires once, as in the reference."""
    at, back = sorted((min(at, len(events)), min(back, len(events))))
    first = opened(Process(Lapses))
    out = run_part([first], events[:at])
    whole = first.snapshot()
    owner = lambda k: key_group(k) % (copies + 1)     # noqa: E731 - copies own whole key groups
    parts = []
    for index in range(copies + 1):
        part = opened(Process(Lapses))
        part.restore(first.split_state(whole, lambda k, i=index: owner(k) == i))
        parts.append(part)
    out += run_part(parts, events[at:back], owner)
    merged = opened(Process(Lapses))
    merged.restore(merged.merge_states([p.snapshot() for p in parts]))
    out += feed([merged], events[back:], [])
    assert per_key(out) == expected(events)


def run_part(ops, events, owner=lambda k: 0):
    """Feed ``events`` in one batch with its watermark, no end of stream."""
    out = []
    for index, op in enumerate(ops):
        emit = Emitter()
        op.process([e for e in events if owner(e["key"]) == index], emit)
        out += emit
    if events:
        out += watermark(ops, max(e["ts"] for e in events) - DELAY - 1)
    return out


class Counts:
    """Emits the key's running count with every event (for ttl)."""

    def on_event(self, event, ctx):
        ctx.state["n"] = ctx.state.get("n", 0) + 1
        ctx.emit({"key": ctx.key, "i": event["i"], "n": ctx.state["n"]})


@settings(max_examples=60, deadline=None)
@given(streams(), st.lists(st.integers(0, 120), max_size=5), st.sampled_from([1, 20, 100, 400]))
def test_ttl_empties_a_key_idle_that_long_as_the_reference(events, cuts, ttl):
    op = opened(Process(Counts, ttl=ttl))
    ref = {k: v for k, v in process_reference(Counts(), events, ttl=ttl).items() if v}
    assert per_key(feed([op], events, cuts)) == ref


def test_ttl_frees_the_memory_of_idle_keys():
    op = opened(Process(Counts, ttl="100ms"))
    op.process([{"key": k, "ts": 10, "i": k} for k in range(50)], Emitter())
    op.on_watermark(10, Emitter())
    assert len(held(op)) == 50
    op.on_watermark(500, Emitter())
    assert held(op) == {}


class Alarm:
    """Sets a processing-time timer; on_timer reports the domain; cancel of an event timer works."""

    def on_event(self, event, ctx):
        ctx.timers.at(event["ts"] + 5)
        ctx.timers.cancel(event["ts"] + 5)
        ctx.state["due"] = ctx.timers.after(0)

    def on_timer(self, ts, key, ctx):
        ctx.emit((key, ts == ctx.state.pop("due"), ctx.domain))


def test_processing_time_timers_fire_at_the_next_batch_after_they_are_due():
    op = opened(Process(Alarm))
    op.process([{"key": "a", "ts": 1}], Emitter())
    op.on_watermark(1, emit := Emitter())
    time.sleep(0.002)                        # the wall clock must pass the due ms
    op.process([], emit)
    assert emit == [("a", True, "processing")]
    op.on_watermark(MAX_WATERMARK, end := Emitter())
    assert end == [] and held(op) == {}, "the cancelled event timer fired or stayed"


class Fragile:
    def on_event(self, event, ctx):
        ctx.timers.at(event["ts"])
        if event.get("bad"):
            raise ValueError("bad event")

    def on_timer(self, ts, key, ctx):
        if ts == 7:
            raise RuntimeError("bad timer")
        ctx.emit(ts)


def test_late_events_go_aside_and_failures_are_dead_letters_while_the_stream_goes_on():
    op = opened(Process(Fragile))
    op.on_watermark(5, Emitter())
    op.process([{"key": 1, "ts": 3}, {"key": 1, "ts": 6, "bad": True}, {"key": 1, "ts": 7},
                {"key": 1, "ts": 8}, {"key": 1}], emit := Emitter())
    assert emit.sides == {"late": [{"key": 1, "ts": 3}]}
    assert "KeyError" in emit.dead[0].error
    op.on_watermark(MAX_WATERMARK, emit := Emitter())
    assert list(emit) == [6, 8]
    assert [d.item for d in emit.dead] == [{"key": 1, "ts": 6, "bad": True}, {"timer": 7, "key": 1}]
    assert "bad timer" in emit.dead[1].error


def test_process_needs_a_class_with_on_event_and_a_keyed_stream():
    with pytest.raises(TypeError, match="on_event"):
        Process(Lapses())
    app = Application("process-checks")
    with pytest.raises(InvalidApplication, match="key_by"):
        app.source("iterable", items=[]).process(Lapses)
    with pytest.raises(InvalidApplication, match="unexpected keyword"):
        app.source("iterable", items=[]).key_by("key").process(Lapses, gapp=3)


def test_a_process_function_registered_by_name_runs_as_the_class_does():
    from support_ops import LapsesProcess

    events = [{"key": i % 3, "ts": i * 7, "i": i} for i in range(60)]
    op = opened(LapsesProcess(gap=45, ttl=None))
    assert LapsesProcess.name == "lapses" and op.parameters() == {"gap": 45, "ttl": None}
    again = opened(type(op)(**op.parameters()))
    assert per_key(feed([op], events, [10, 30])) == expected(events) == per_key(feed([again], events, [5]))


def in_backend(backend, tmp_path):
    """The dask config that makes ``open`` put an operator's keyed state in ``backend``."""
    import dask.config

    return dask.config.set({"pescheduler.state.backend": backend, "pescheduler.state.dir": str(tmp_path)})


def handed(src, dst, groups):
    """A rescale's hand-over of ``groups`` from running ``src`` to running ``dst``, through the
    worker's functions and a pickle round trip as between two workers."""
    import cloudpickle

    from pescheduler.worker.handover import export_groups, import_groups

    import_groups(dst, cloudpickle.loads(cloudpickle.dumps(export_groups(src, groups))))


@pytest.mark.parametrize("backend", ["memory", "disk"])
@settings(max_examples=25, deadline=None)
@given(events=streams(), at=st.integers(0, 120), back=st.integers(0, 120))
def test_key_groups_handed_to_a_copy_and_back_fire_every_timer_once(tmp_path_factory, backend, events, at, back):
    """Replicate then Release as the worker does it (export_groups/import_groups between two running
    instances), with a checkpoint-style snapshot alive across the hand-over: as the reference."""
    at, back = sorted((min(at, len(events)), min(back, len(events))))
    with in_backend(backend, tmp_path_factory.mktemp("state")):
        first, copy = opened(Process(Lapses)), opened(Process(Lapses))
        assert first._keys.backend == backend
        out = run_part([first], events[:at])
        view = first.snapshot()                                  # a checkpoint's view, alive
        moving = frozenset(g for g in range(128) if g % 2)
        handed(first, copy, moving)
        owner = lambda k: int(key_group(k) in moving)            # noqa: E731
        out += run_part([first, copy], events[at:back], owner)
        handed(copy, first, moving)
        assert held(copy) == {} and copy._pending == []
        out += feed([first], events[back:], [])
        assert per_key(out) == expected(events)
        assert dict(view)                                         # the view outlived the hand-over
        first._keys.close(), copy._keys.close()


def test_the_disk_backend_holds_the_records_and_restores_them_from_a_snapshot(tmp_path):
    """On ``disk`` a key's state and timers are in the RocksDB store, not in the operator; a
    snapshot restored into a memory instance goes on as the original would."""
    events = [{"key": i % 7, "ts": i * 3, "i": i} for i in range(300)]
    with in_backend("disk", tmp_path):
        op = opened(Process(Lapses))
        out = run_part([op], events[:150])
        stored = op._keys.get(3)
        assert op._keys.backend == "disk" and stored.timers and len(op._keys) == 7
        assert stored is not op._keys.get(3)                       # a copy of what the store holds
        saved = op.snapshot()
    again = opened(Process(Lapses))
    again.restore(saved)
    op._keys.close()
    assert again._keys.backend == "memory" and held(again).keys() == set(range(7))
    out += feed([again], events[150:], [])
    assert per_key(out) == expected(events)


def test_a_checkpoint_taken_while_records_were_per_key_still_restores_split_and_merged():
    """Before the records lived in the keyed state backend a snapshot held ``keys``: (key, record)
    pairs. Such a checkpoint restores (also split into copies and merged back), timers included."""
    old = {"watermark": 0, "pending": [],
           "keys": [(7, ({"n": 2, "due": 100}, [100], [], 55)), (8, ({"n": 1, "due": 90}, [90], [], 45))]}
    op = opened(Process(Lapses))
    parts = [op.split_state(old, lambda k, mine=mine: (key_group(k) == key_group(7)) == mine) for mine in (True, False)]
    op.restore(op.merge_states(parts))
    fired = watermark([op], MAX_WATERMARK)
    assert sorted((r["key"], r["timer"], r["n"]) for r in fired) == [(7, 100, 2), (8, 90, 1)]

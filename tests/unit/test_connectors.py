"""The broker connectors' pure parts: per-partition watermarks, value formats, and how a
partitioned source's positions are spread over copies and gathered (no broker; the same
paths run against real brokers in tests/integration/test_kafka.py and test_redis.py)."""

from __future__ import annotations

import pytest

from pescheduler import Application, Release, Replicate
from pescheduler.plan.state import keyed_rebalanced, redistribute
from pescheduler.operator import MIN_WATERMARK, Share
from pescheduler.operators.kafka import KafkaSource
from pescheduler.operators.partitions import PartitionClock, decoder, encoder
from pescheduler.operators.redis_streams import RedisStreamSource
from pescheduler.plan.compiler import compile_app
from pescheduler.plan.transforms import transform, with_slots
from pescheduler.plugins import load_plugins


def test_watermark_is_the_least_partition_and_idle_partitions_stop_holding_it():
    now = [100.0]
    clock = PartitionClock(max_delay=100, idle_timeout_s=5.0, clock=lambda: now[0])
    clock.assign([0, 1])
    clock.seen_max(0, 10_000)
    assert clock.watermark() is None                       # partition 1 has no data yet
    clock.seen_max(1, 5_000)
    assert clock.watermark() == 5_000 - 101
    now[0] += 5.0
    clock.seen_max(0, 12_000)
    assert clock.watermark() == 5_000 - 101                # 1 quiet exactly idle_timeout: still counts
    now[0] += 0.001
    assert clock.watermark() == 12_000 - 101               # 1 quiet for longer than idle_timeout
    assert clock.watermark(behind=lambda p: p == 1) == 5_000 - 101   # quiet but with a backlog: not idle


def test_share_deals_partitions_round_robin():
    owned = [[p for p in range(7) if Share(i, 3)(p)] for i in range(3)]
    assert owned == [[0, 3, 6], [1, 4], [2, 5]]


def test_value_formats_round_trip_and_refuse_unknown_names():
    assert decoder("json")(encoder("json")({"a": 1})) == {"a": 1}
    assert decoder("bytes")(b"x") == b"x"
    assert decoder(lambda b: b.upper())(b"x") == b"X"
    with pytest.raises(ValueError, match="value_format"):
        decoder("xml")


def test_kafka_merge_prefers_the_owner_and_split_keeps_every_offset():
    src = KafkaSource(topic="t")
    a = {"positions": {0: 10, 1: 3, 2: 7}, "max_ts": {0: 5}, "share": Share(0, 2)}   # reads 0, 2
    b = {"positions": {0: 1, 1: 20, 2: 1}, "max_ts": {1: 9}, "share": Share(1, 2)}   # reads 1
    merged = src.merge_states([a, b])
    assert merged["positions"] == {0: 10, 1: 20, 2: 7} and merged["max_ts"] == {0: 5, 1: 9}
    part = src.split_state(merged, Share(1, 3))
    assert part["positions"] == merged["positions"] and part["share"] == Share(1, 3)


def test_redis_merge_prefers_the_stream_owner():
    src = RedisStreamSource(stream=["a", "b"])
    one = {"positions": {"a": "5-0", "b": "0-0"}, "max_ts": {}, "share": Share(0, 2)}
    two = {"positions": {"a": "0-0", "b": "9-1"}, "max_ts": {}, "share": Share(1, 2)}
    assert src.merge_states([one, two])["positions"] == {"a": "5-0", "b": "9-1"}


def test_start_and_event_time_arguments():
    assert KafkaSource(topic="t", event_time="when").ts_field == "when"
    assert KafkaSource(topic="t", event_time=None).ts_field is None
    assert KafkaSource(topic="t").ts_field == "ts"            # the record timestamp goes to ts
    assert KafkaSource(topic="t", start={"1": "5"}).start == {1: 5}
    with pytest.raises(ValueError, match="start"):
        KafkaSource(topic="t", start="yesterday")


WORKERS = ["tcp://a", "tcp://b", "tcp://c"]


@pytest.fixture
def placement():
    app = Application("spread")
    app.source("kafka", topic="t").map(lambda t: t).sink("discard")
    return with_slots(compile_app(app, load_plugins([]), WORKERS, {w: w for w in WORKERS}), 1)


def test_replicating_a_partitioned_source_replaces_every_instance_and_deals_its_partitions(placement):
    new = transform(placement, Replicate("kafka-1", 2))
    assert new.instances("kafka-1") == ["kafka-1", "kafka-1#1", "kafka-1#2"]
    assert keyed_rebalanced(placement, new) == {placement.pe_of("kafka-1")}     # the original is replaced
    saved = {"kafka-1": {"state": {"positions": {0: 4, 1: 8, 2: 1}, "max_ts": {}, "share": Share()},
                         "progress": ({}, MIN_WATERMARK, set(), False), "driver": {"count": 13}}}
    states = redistribute(placement, new, saved)
    assert [states[i]["state"]["share"] for i in new.instances("kafka-1")] == [Share(0, 3), Share(1, 3), Share(2, 3)]
    assert all(states[i]["state"]["positions"] == {0: 4, 1: 8, 2: 1} for i in new.instances("kafka-1"))
    assert states["kafka-1"]["driver"] == {"count": 13} and states["kafka-1#1"]["driver"] is None


def test_releasing_gathers_the_partitions_on_the_remaining_instances(placement):
    two = transform(placement, Replicate("kafka-1", 1))
    one = transform(two, Release("kafka-1", 1))
    saved = {"kafka-1": {"state": {"positions": {0: 4, 1: 2}, "max_ts": {}, "share": Share(0, 2)},
                         "progress": ({}, MIN_WATERMARK, set(), False), "driver": None},
             "kafka-1#1": {"state": {"positions": {0: 0, 1: 9}, "max_ts": {}, "share": Share(1, 2)},
                           "progress": ({}, MIN_WATERMARK, set(), False), "driver": None}}
    states = redistribute(two, one, saved)
    assert "kafka-1#1" not in states
    assert states["kafka-1"]["state"] == {"positions": {0: 4, 1: 9}, "max_ts": {}, "share": Share(0, 1)}


def progress():
    return ({}, MIN_WATERMARK, set(), False)


def sink_app():
    app = Application("sink-copies")
    (app.source("kafka", topic="t").map(lambda t: t)
        .sink("kafka", topic="o", exactly_once=True, id="out"))
    return with_slots(compile_app(app, load_plugins([]), WORKERS, {w: w for w in WORKERS}), 1)


def test_a_released_sink_copy_hands_its_state_to_the_original():
    one = sink_app()
    two = transform(one, Replicate("out", 1))
    assert keyed_rebalanced(one, two) == set(), "a new copy takes nothing over: the original stays"
    after = transform(two, Release("out", 1))
    assert keyed_rebalanced(two, after) == {two.pe_of("out")}, "the original is replaced to take over"
    mine = {"op": "out", "transactional_ids": 2, "marker_base": 0, "parked": [], "open": [(b"a", None)],
            "adopt": []}
    copy = {"op": "out#1", "transactional_ids": 3, "marker_base": 7, "parked": [[4, [(b"b", None)]]],
            "open": [(b"c", None)], "adopt": []}
    saved = {"out": {"state": mine, "progress": progress(), "driver": None},
             "out#1": {"state": copy, "progress": progress(), "driver": None}}
    for placed in (after, one):              # a Release, and a restore onto fewer instances
        states = redistribute(two, placed, saved)
        assert "out#1" not in states
        merged = states["out"]["state"]
        assert merged["open"] == [(b"a", None)] and merged["transactional_ids"] == 2
        assert merged["adopt"] == [{k: v for k, v in copy.items() if k != "adopt"}]


def test_sinks_merge_states_keep_the_first_and_take_the_others_over():
    from pescheduler.operators.kafka import KafkaSink
    from pescheduler.operators.redis_streams import RedisStreamSink

    inner = {"op": "k#2", "transactional_ids": 1, "parked": [], "open": []}
    a = {"op": "k", "transactional_ids": 1, "parked": [], "open": [], "adopt": []}
    b = {"op": "k#1", "transactional_ids": 2, "parked": [[3, []]], "open": [], "adopt": [inner]}
    merged = KafkaSink(topic="o", exactly_once=True).merge_states([a, b])
    assert {k: v for k, v in merged.items() if k != "adopt"} == {k: v for k, v in a.items() if k != "adopt"}
    assert [s["op"] for s in merged["adopt"]] == ["k#1", "k#2"]
    r1 = {"op": "r", "staged": True, "epochs": {"current": 3, "pending": []}, "open": 0, "adopted": [], "adopt": []}
    r2 = {"op": "r#1", "staged": True, "epochs": {"current": 5, "pending": [[4, 4, 9]]}, "open": 2,
          "adopted": [], "adopt": []}
    merged = RedisStreamSink(stream="s").merge_states([r1, r2])
    assert merged["epochs"] == r1["epochs"] and [s["op"] for s in merged["adopt"]] == ["r#1"]


def test_redis_entries_through_a_position_as_redis_estimates_them():
    from pescheduler.operators.redis_streams import entries_through

    info = {"entries-added": 10, "length": 6, "last-generated-id": b"20-0", "first-entry": (b"11-0", {}),
            "max-deleted-entry-id": b"0-0"}                        # 4 trimmed from the head, 6 left: 11..20
    assert entries_through("0-0", info) == 4                      # before the first: everything trimmed
    assert entries_through("11-0", info) == 5 and entries_through("20-0", info) == 10
    assert entries_through("15-0", info) is None                  # inside: the source counts itself
    assert entries_through("21-0", info) is None                  # beyond the last: not a position of it
    deleted = {**info, "max-deleted-entry-id": b"13-0"}           # a hole after the first entry
    assert entries_through("0-0", deleted) is None and entries_through("20-0", deleted) == 10
    assert entries_through("0-0", {**info, "entries-added": 0, "length": 0}) == 0
    assert entries_through("3-0", {**info, "length": 0}) == 10    # emptied: all before the last id

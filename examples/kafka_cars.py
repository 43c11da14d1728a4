"""Connected cars through Kafka: events produced into a topic, averaged per car and minute, written back.

Start a broker (see docs/connectors.md: Tansu in one command), then::

    python examples/kafka_cars.py [--bootstrap 127.0.0.1:9092] [--events 20000]

It produces the generator's car events into ``cars`` (2 partitions), deploys
``kafka -> map -> filter -> key_by -> window -> kafka`` with an exactly-once
(transactional) sink into ``avg-speed``, stops once the source has read every
event (stopping drains: the last windows fire and the transaction commits),
and compares what a ``read_committed`` consumer sees with the plain-Python
reference of connected_cars.py.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import uuid

import pescheduler
from pescheduler import Application

from connected_cars import GENERATOR, moving, reference, to_metres_per_second


def produce_cars(bootstrap: str, topic: str, events: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from pescheduler.operators.sources import GeneratorSource

    admin = AdminClient({"bootstrap.servers": bootstrap})      # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    source, i = GeneratorSource(**{**GENERATOR, "events": events}), 0
    while (batch := source.read(10_000)) is not None:
        for e in batch:
            producer.produce(topic, json.dumps(e).encode(), partition=i % 2)
            i += 1
            if i % 10_000 == 0:
                producer.flush(60)
    assert producer.flush(60) == 0


def build(bootstrap: str, topic: str, out: str) -> Application:
    app = Application("kafka-cars")
    (app.source("kafka", topic=topic, bootstrap_servers=bootstrap, event_time="ts")
        .map(to_metres_per_second)
        .filter(moving)
        .key_by("car")
        .window(size="60s", aggregates={"avg_speed": ("avg", "speed")})
        .sink("kafka", topic=out, bootstrap_servers=bootstrap, key="car", exactly_once=True, create=True))
    return app


def read_committed(bootstrap: str, topic: str, timeout: float = 60) -> list[dict]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kafka-cars-check",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    rows, deadline, quiet = [], time.monotonic() + timeout, 0
    while time.monotonic() < deadline and quiet < 10:        # ten empty polls in a row: all read
        msgs = consumer.consume(1000, 0.2)
        quiet = 0 if msgs else quiet + 1
        rows += [json.loads(m.value()) for m in msgs if m.error() is None]
    consumer.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]                 # fresh topics, so the example can be run again
    topic, out = f"cars-{run}", f"avg-speed-{run}"
    produce_cars(args.bootstrap, topic, args.events)
    with pescheduler.deploy(build(args.bootstrap, topic, out), workers=2, policies=[]) as dep:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            read = sum(s["operators"].get("kafka-1", {}).get("tuples_out", 0) for s in dep.pe_stats().values())
            if read >= args.events:
                break
            time.sleep(0.2)
        status = dep.stop()
    print(f"read {read} events; late events: {status['late_events']}")
    rows = read_committed(args.bootstrap, out)
    key = lambda r: (r["window_start"], r["car"])  # noqa: E731
    got, want = sorted(rows, key=key), sorted(reference(args.events), key=key)
    same = len(got) == len(want) and all(
        key(a) == key(b) and a["window_end"] == b["window_end"] and math.isclose(a["avg_speed"], b["avg_speed"])
        for a, b in zip(got, want))
    print(f"{len(rows)} windows in {out}; equal to the plain-Python reference: {same}")


if __name__ == "__main__":
    main()

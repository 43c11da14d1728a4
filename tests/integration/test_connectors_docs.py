"""docs/connectors.md runs as written: its ```python broker blocks, against brokers the fixtures start.

The plain ```python blocks of every doc run in tests/unit/test_docs.py without a broker; these
need one, so they are marked with the info string ``python broker`` and run here, with the
``KAFKA`` and ``REDIS`` environment variables pointing at the fixtures' brokers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from brokers import committed_log, consume_all, start_redis, start_tansu, topic_size

pytestmark = [pytest.mark.integration, pytest.mark.broker]

DOC = Path(__file__).parent.parent.parent / "docs" / "connectors.md"
BLOCKS = re.findall(r"```python broker\n(.*?)```", DOC.read_text(), re.S)


@pytest.fixture(scope="module")
def brokers():
    with start_tansu() as kafka, start_redis() as redis:
        yield kafka.address, f"redis://{redis.address}/0"


def test_connector_docs_run_as_written(brokers, monkeypatch):
    import redis

    kafka, redis_url = brokers
    monkeypatch.setenv("KAFKA", kafka)
    monkeypatch.setenv("REDIS", redis_url)
    assert len(BLOCKS) == 3
    for i, code in enumerate(BLOCKS):
        namespace = {"__name__": f"docs_broker_{i}"}
        try:
            exec(compile(code, f"connectors.md[broker {i}]", "exec"), namespace)
        finally:
            # The block's lambdas refer to this namespace, which holds them (through the app): a
            # cycle that kept the block's Kafka producer alive until the collector ran, reconnecting
            # to the broker after the fixture had stopped it ("Connect ... refused").
            namespace.clear()
    windows = consume_all(kafka, "avg-speed", 1, timeout=30)
    assert windows, "the Kafka example wrote no window"
    assert redis.Redis.from_url(redis_url).xlen("doubled") == 1000
    paid = [json.loads(v) for values in committed_log(kafka, "payments-cents").values() for v in values]
    assert sorted(p["id"] for p in paid) == list(range(5000))            # exactly-once: each once
    assert all(p["cents"] == 100 * p["amount"] for p in paid)
    # the sinks' create=True, partitions=N made exactly N, not the broker's auto-created default (4)
    assert (topic_size(kafka, "avg-speed"), topic_size(kafka, "payments-cents")) == (1, 2)

"""Kafka topic creation is ``create=`` and ``partitions=``'s alone: a config that would let the
broker auto-create topics (with its own default partition count) is refused when the operator is
made, naming the setting. (tests/integration/test_kafka.py checks the counts on a real broker.)"""

from __future__ import annotations

import pytest

from pescheduler.operators.kafka import KafkaSink, KafkaSource


@pytest.mark.parametrize("make", [KafkaSource, KafkaSink])
@pytest.mark.parametrize("value", [True, False, "true"])
def test_a_config_setting_allow_auto_create_topics_is_refused_naming_it(make, value):
    with pytest.raises(ValueError, match="allow.auto.create.topics.*create=True and partitions=N"):
        make(topic="t", config={"allow.auto.create.topics": value})



class _Metadata:
    """What librdkafka's ``list_topics`` answers, for a client that sees ``counts`` in turn."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts

    def list_topics(self, topic, timeout):
        from types import SimpleNamespace

        n = self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]
        info = SimpleNamespace(error=None, partitions=dict.fromkeys(range(n)))
        return SimpleNamespace(topics={topic: info} if n else {})


def test_a_topic_another_instance_created_meanwhile_is_used_as_it_is_with_a_warning(monkeypatch, caplog):
    # The race the real broker cannot stage on demand: missing at the first look, TOPIC_ALREADY_EXISTS
    # at creation (another instance, or client, won), then visible with its own count.
    from pescheduler.operators import kafka

    monkeypatch.setattr(kafka, "_create_topic", lambda *a: False)
    with caplog.at_level("WARNING", logger="pescheduler.operators.kafka"):
        found = kafka.topic_partitions(_Metadata([0, 0, 4]), {}, "raced", "b:9092", 5.0, True, 2)
    assert found == [0, 1, 2, 3]
    assert [r.getMessage() for r in caplog.records] == [
        "kafka topic 'raced' on b:9092 already exists with 4 partitions, not partitions=2: it is used as it is"]


def test_a_created_topic_waits_for_all_its_partitions_in_the_metadata(monkeypatch, caplog):
    from pescheduler.operators import kafka

    monkeypatch.setattr(kafka, "_create_topic", lambda *a: True)
    with caplog.at_level("WARNING", logger="pescheduler.operators.kafka"):
        assert kafka.topic_partitions(_Metadata([0, 1, 3]), {}, "new", "b:9092", 5.0, True, 3) == [0, 1, 2]
    assert caplog.records == []

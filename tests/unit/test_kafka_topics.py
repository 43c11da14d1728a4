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


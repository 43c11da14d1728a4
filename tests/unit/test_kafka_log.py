"""The exactly-once Kafka sink's log reader connects as the sink's librdkafka producers do: their
security settings mapped onto kafka-python's, and a setting it cannot carry over refused at open,
naming the key (no broker here; the reader runs against a real Tansu, plain and behind TLS, in
tests/integration/test_kafka.py)."""

from __future__ import annotations

import pytest

from pescheduler.operator import OperatorContext
from pescheduler.operators.kafka import KafkaSink
from pescheduler.operators.kafka_log import LogReader, client_settings


def test_librdkafka_security_settings_map_onto_kafka_pythons():
    assert client_settings({
        "security.protocol": "SASL_SSL", "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/client.pem", "ssl.key.location": "/client.key",
        "ssl.key.password": "k", "ssl.crl.location": "/crl.pem",
        "sasl.mechanism": "scram-sha-512", "sasl.username": "alice", "sasl.password": "s3cret",
        "ssl.endpoint.identification.algorithm": "none",
    }) == {
        "security_protocol": "SASL_SSL", "ssl_cafile": "/ca.pem", "ssl_certfile": "/client.pem",
        "ssl_keyfile": "/client.key", "ssl_password": "k", "ssl_crlfile": "/crl.pem",
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "alice", "sasl_plain_password": "s3cret",
        "ssl_check_hostname": False,
    }
    # librdkafka's older plural spelling, its lower-case protocols, and "probe" (the system's CAs,
    # which kafka-python loads when given no CA file)
    assert client_settings({"security.protocol": "sasl_plaintext", "sasl.mechanisms": "PLAIN",
                            "ssl.ca.location": "probe"}) == \
        {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "ssl_cafile": None}


def test_settings_that_only_tune_a_producer_do_not_change_how_the_log_is_read():
    assert client_settings({"linger.ms": 5, "compression.type": "lz4", "acks": "all",
                            "transaction.timeout.ms": 60_000, "client.id": "x"}) == {}


@pytest.mark.parametrize("key, value", [
    ("sasl.mechanism", "GSSAPI"),                 # Kerberos: librdkafka runs kinit, kafka-python does not
    ("sasl.mechanisms", "OAUTHBEARER"),           # needs a token provider object
    ("sasl.oauthbearer.config", "scope=x"),
    ("ssl.ca.pem", "-----BEGIN CERTIFICATE-----"),   # inline PEM: kafka-python takes files
    ("ssl.keystore.location", "/client.p12"),
    ("enable.ssl.certificate.verification", "false"),
    ("security.protocol", "tls"),
    ("ssl.endpoint.identification.algorithm", "dns"),
])
def test_a_security_setting_the_reader_cannot_take_is_refused_naming_the_key(key, value):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        client_settings({key: value})


def test_an_exactly_once_sink_refuses_it_at_open_before_reaching_for_the_broker():
    # Port 1: nothing listens. The error is the setting's, at once, not the broker's after 10 s.
    sink = KafkaSink(topic="out", bootstrap_servers="127.0.0.1:1", exactly_once=True,
                     config={"security.protocol": "sasl_ssl", "sasl.mechanism": "GSSAPI"})
    with pytest.raises(ValueError, match=r"sasl\.mechanism='GSSAPI'"):
        sink.open(OperatorContext("kafka-2", extra={"checkpoint": True}))
    sink.close()


def test_the_reader_names_the_address_it_cannot_reach():
    with LogReader("127.0.0.1:1", timeout_s=0.5) as log, pytest.raises(ConnectionError, match="127.0.0.1:1"):
        log.partitions("out")

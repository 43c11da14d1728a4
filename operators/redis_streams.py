"""Redis Streams source and sink (redis-py): ``XREAD`` / ``XADD``, entry ids as positions.

The source reads without a consumer group, so its position (the last entry
id read per stream) lives with pescheduler (checkpoints, snapshots) rather
than in Redis. Several streams are partitions of one source: stream ``i`` of
``stream=[...]`` belongs to the instance whose :class:`~pescheduler.operator.Share`
owns ``i``, so replicating the source spreads streams over its copies.
Reads never block (no ``BLOCK``): the PE loop asks again when it is idle.

Lag (entries behind per stream, for the monitor as Kafka's records behind):
``XINFO STREAM`` says how many entries were ever added; the source counts how
many of those lie at or before its position, as Redis does for a consumer
group's ``entries-read`` (:func:`entries_through`), and adds what it reads
since. The info is fetched on the source's own read path, pipelined, at most
twice per monitor interval, so asking for the lag costs no round trip.
"""

from __future__ import annotations

from time import monotonic
from typing import Any, Callable

from pescheduler import config
from pescheduler.errors import DeliveryFailed
from pescheduler.operator import Parallelism, Sink
from pescheduler.redact import redact
from pescheduler.timeutil import parse_duration

from .partitions import PartitionedSource, decoder, encoder
from .staging import Epochs, retried, serialized

FIELD = b"data"          # the entry field holding the encoded tuple ("json"/"bytes" formats)


def _client(url: str, timeout_s: float):
    """A redis-py client that fails within ``timeout_s`` naming ``url`` when Redis is not there."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=max(timeout_s, 5))
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        raise ConnectionError(f"redis: cannot reach {redact(url)} within {timeout_s:g} s ({exc}); "
                              f"is redis-server running, and is url right?") from None
    return client


def _entry_id(text: bytes | str) -> tuple[int, int]:
    ms, _, seq = (text.decode() if isinstance(text, bytes) else str(text)).partition("-")
    return int(ms), int(seq or 0)


def entries_through(position: str, info: dict) -> int | None:
    """How many entries were ever added to a stream up to and including ``position``, from its
    ``XINFO STREAM`` answer; ``None`` when nobody can tell (a position inside the stream after
    entries were deleted there). The same estimate Redis makes for a consumer group created at
    an id (``streamEstimateDistanceFromFirstEverEntry``): exact at the last entry or before
    the first; unknowable in between, which the source then counts itself as it reads."""
    added, length = int(info["entries-added"]), int(info["length"])
    at, last = _entry_id(position), _entry_id(info["last-generated-id"])
    if added == 0:
        return 0
    if at == last or (length == 0 and at <= last):
        return added
    if at > last:
        return None
    first = _entry_id(info["first-entry"][0]) if info.get("first-entry") else last
    deleted = _entry_id(info["max-deleted-entry-id"])
    if deleted == (0, 0) or deleted < first:        # nothing deleted after the first entry
        if at < first:
            return added - length
        if at == first:
            return added - length + 1
    return None


def _streams(stream: str | list[str]) -> list[str]:
    names = [stream] if isinstance(stream, str) else list(stream)
    if not names or not all(isinstance(s, str) and s for s in names):
        raise ValueError(f"redis stream must be a name or a list of names, got {stream!r}")
    return names


class RedisStreamSource(PartitionedSource):
    """Entries of Redis streams: ``app.source("redis", stream="cars", url="redis://127.0.0.1:6379")``.

    ``start``: ``"0-0"`` (from the beginning, default), ``"$"`` (only entries
    added after the source opens) or ``{stream: entry id}`` (read after that id).
    ``value_format``: ``"json"`` / ``"bytes"`` decode the entry's ``data`` field;
    ``"fields"`` gives the entry's fields as a dict of str; a callable receives
    the field dict (bytes). A bad entry is dead-lettered with its stream and id.
    ``event_time``: ``"id"`` puts the entry id's milliseconds (when Redis took it)
    into ``ts_field``; a field name or a callable reads event time from the
    tuple (a number in ``ts_unit``, default ``"ms"``, a datetime or an ISO-8601
    string); ``None`` has none; an entry without a valid event time is a dead
    letter with the reason. Watermarks are per stream, with ``idle_timeout`` as for Kafka.
    """

    name = "redis"
    requires = ("redis",)                 # checked at deploy (pescheduler/requirements.py)
    install = "pescheduler[redis]"
    poll_interval = 0.01       # XREAD without BLOCK: ask again soon when a stream had nothing new

    def __init__(self, stream: str | list[str], url: str = "redis://127.0.0.1:6379/0", start: str | dict = "0-0",
                 value_format: str | Callable = "json", event_time: str | Callable | None = "id",
                 idle_timeout: Any = "5s", connect_timeout: Any = "10s", ts_field: str | None = "ts",
                 **kwargs: Any) -> None:
        stamp = event_time == "id"
        super().__init__(ts_field=(ts_field if stamp else event_time), idle_timeout=idle_timeout, **kwargs)
        self.streams, self.url = _streams(stream), url
        if not (isinstance(start, (str, dict))):
            raise ValueError(f"redis start must be '0-0', '$' or {{stream: entry id}}, got {start!r}")
        self.start = start
        self.fields = value_format == "fields"
        self.decode = None if self.fields else decoder(value_format)
        self.whole = callable(value_format)          # a callable decodes the whole field dict
        self.stamp = stamp and self.ts_field is not None
        self.timeout_s = parse_duration(connect_timeout) / 1000
        self._index = {s: i for i, s in enumerate(self.streams)}
        self._client = None
        self._mine: dict[str, str] = {}
        self._through: dict[str, int | None] = {}    # stream -> entries ever added up to the position
        self._added: dict[str, int] = {}             # stream -> entries ever added (last XINFO)
        self._info_due = 0.0                          # when to fetch XINFO STREAM again (monotonic)

    def open(self, context: Any) -> None:
        super().open(context)
        self._client = _client(self.url, self.timeout_s)
        mine = [s for i, s in enumerate(self.streams) if self.share(i)]
        for s in mine:
            if s not in self._positions:
                start = self.start.get(s, "0-0") if isinstance(self.start, dict) else self.start
                self._positions[s] = self._newest(s) if start == "$" else start
        self._mine = {s: self._positions[s] for s in mine}
        self._clock.assign(mine, self._saved_ts)

    def _newest(self, stream: str) -> str:
        """The id of the stream's last entry now ('$' made concrete, so a restore resumes there)."""
        top = self._client.xrevrange(stream, count=1)
        return top[0][0].decode() if top else "0-0"

    def read(self, n: int) -> list:
        if not self._mine:
            return []
        if monotonic() >= self._info_due:
            return self._read_with_info(n)
        return self._took(self._client.xread(self._mine, count=n))

    def _took(self, answer: list) -> list:
        out: list = []
        for name, entries in answer:
            stream = name.decode()
            out.extend(self._decode(stream, entries))
            self._mine[stream] = self._positions[stream] = entries[-1][0].decode()
            through = self._through.get(stream)
            self._through[stream] = None if through is None else through + len(entries)
        return out

    def _read_with_info(self, n: int) -> list:
        """XINFO STREAM of each stream read, then XREAD, in one round trip; the lag's figures."""
        self._info_due = monotonic() + config.get_seconds("monitor.interval") / 2
        pipe = self._client.pipeline(transaction=False)
        for stream in self._mine:
            pipe.xinfo_stream(stream)
        pipe.xread(self._mine, count=n)
        *infos, answer = pipe.execute(raise_on_error=False)
        if isinstance(answer, Exception):
            raise answer
        for stream, info in zip(list(self._mine), infos):
            if isinstance(info, Exception):           # no such stream (yet): nothing added, nothing behind
                info = {"entries-added": 0, "length": 0, "last-generated-id": b"0-0"}
            self._added[stream] = int(info["entries-added"])
            known = entries_through(self._mine[stream], info)
            if known is not None:
                self._through[stream] = known
            elif _entry_id(info.get("max-deleted-entry-id", b"0-0")) > _entry_id(self._mine[stream]):
                self._through[stream] = None         # deleted entries ahead: the count would be wrong
        return self._took(answer)

    def lag(self) -> dict[str, int]:
        """Entries behind per stream (those whose count is known; see the module docstring)."""
        behind = {}
        for stream in list(self._mine):
            through, added = self._through.get(stream), self._added.get(stream)
            if through is not None and added is not None:
                behind[stream] = max(0, added - through)
        return behind

    def _decode(self, stream: str, entries: list) -> list:
        out, decode, field, stamp, top = [], self.decode, self.ts_field, self.stamp, None
        event_time = self.event_time
        for entry_id, values in entries:
            try:
                if self.fields:
                    t = {k.decode(): v.decode() for k, v in values.items()}
                else:
                    t = decode(values) if self.whole else decode(values[FIELD])
                if stamp:
                    ts = t[field] = int(entry_id.split(b"-", 1)[0])
                elif field is not None:
                    ts = event_time.stamp_one(t)       # BadEventTime: a dead letter with the reason
                else:
                    out.append(t)
                    continue
            except Exception as exc:
                self.reject({"stream": stream, "id": entry_id.decode(), "fields": values},
                            f"redis {stream}@{entry_id.decode()}: {exc!r}")
                continue
            out.append(t)
            if top is None or ts > top:
                top = ts
        if top is not None:
            self._clock.seen_max(stream, top)
        return out

    def seek(self, position: dict) -> None:
        self._positions.update(position)
        self._mine = {s: self._positions[s] for s in self._mine}
        self._through, self._info_due = {}, 0.0      # counted again from the new position

    def watermark(self) -> int | None:
        return self._clock.watermark()

    def _number(self, stream: str) -> int:
        return self._index[stream]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


# Publish staged epochs: every entry of each staged list, in order, XADDed to the stream, then the
# list deleted, all in one script (Redis runs a script atomically: a commit is whole or absent,
# and a repeated one finds no list left). KEYS: the stream, then the lists; ARGV[1]: maxlen or "".
_PUBLISH = """
local n = 0
for i = 2, #KEYS do
  for _, packed in ipairs(redis.call('LRANGE', KEYS[i], 0, -1)) do
    if ARGV[1] ~= '' then
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(cmsgpack.unpack(packed)))
    else
      redis.call('XADD', KEYS[1], '*', unpack(cmsgpack.unpack(packed)))
    end
    n = n + 1
  end
  redis.call('DEL', KEYS[i])
end
return n
"""


class RedisStreamSink(Sink):
    """Append tuples to a Redis stream: ``.sink("redis", stream="out", url="redis://127.0.0.1:6379")``.

    One ``XADD`` per tuple, pipelined per batch (one round trip). ``value_format``
    ``"json"`` / ``"bytes"`` / a callable store the encoded tuple in the ``data``
    field; ``"fields"`` stores a dict tuple's items as the entry's fields.
    ``maxlen`` trims the stream approximately (``MAXLEN ~``).

    Without checkpoints: at-least-once, a batch is in the stream when
    ``process`` returns. With checkpoints: exactly-once, by two-phase commit
    inside Redis. Between barriers the entries are staged in a list per epoch
    (``{stream}:pescheduler-staging:{op_id}:e<epoch>``; the hash tag keeps it in
    the stream's cluster slot); ``pre_commit(id)`` seals the epoch under
    ``id`` (:class:`~.staging.Epochs`, as the file sinks do); ``commit(id)``
    moves the sealed lists into the stream with one Lua script, which Redis
    runs atomically, so a crash leaves a commit whole or absent and a repeated
    commit finds nothing left to move. A restored sink deletes the lists its
    snapshot did not know (output after the checkpoint: the sources replay
    it). A copy that goes away (a Release, a restore onto fewer instances)
    hands its staging over (:meth:`merge_states`): the original takes its
    lists as they stood at its snapshot, and publishes them with its own
    commits (an open epoch, which only a reconfiguration's snapshot has, with
    the original's next checkpoint). Why not ids derived from checkpoint and sequence, rejected by
    ``XADD`` on replay: a replay after a restore need not deliver the same
    tuples in the same order (partitions interleave differently, barriers
    fall elsewhere), so equal ids would not mean equal entries.

    Failures: a staged epoch leaves the bookkeeping only once the script that
    published it returned, and a commit that lost its connection is tried again
    (``pescheduler.sinks.retry.*``; the script is idempotent); a write that
    fails is never replayed tuple by tuple: without checkpoints it is retried
    (at-least-once), with them the PE fails at once
    (:class:`~pescheduler.errors.DeliveryFailed`) and the restore cuts the
    staging back to the checkpoint, so nothing is written twice.
    """

    name = "redis"
    may_block = True          # retries a failed write or commit (staging.retried)
    requires = ("redis",)                 # checked at deploy (pescheduler/requirements.py)
    install = "pescheduler[redis]"
    parallelism = Parallelism.STATELESS

    def __init__(self, stream: str, url: str = "redis://127.0.0.1:6379/0", value_format: str | Callable = "json",
                 maxlen: int | None = None, connect_timeout: Any = "10s") -> None:
        self.stream, self.url, self.maxlen = _streams(stream)[0], url, maxlen
        self.fields = value_format == "fields"
        self.encode = None if self.fields else encoder(value_format)
        self.timeout_s = parse_duration(connect_timeout) / 1000
        self._client = None
        self._staged = False                    # two-phase mode (checkpoints on)
        self._epochs = Epochs()
        self._state: dict | None = None         # from restore: what open() reinstates
        self._publish = None
        self._adopted: list = []                # [checkpoint id | None, list key] of copies taken over
        self._adopt: list = []                  # restored: states of copies to take over in open()

    def open(self, context: Any) -> None:
        super().open(context)
        self._client = _client(self.url, self.timeout_s)
        self._prefix = self._prefix_of(context.op_id)
        self._publish = self._client.register_script(_PUBLISH)
        if self._state is not None:
            self._reinstate(self._state)
        elif not self._adopt and "#" not in context.op_id:   # a fresh original (copies X#k start mid-run):
            self._discard(lambda epoch: True)   # a fresh run, so an earlier one's staging is stale,
            stale = list(self._client.scan_iter(match=self._prefix_of(context.op_id + "#*") + "*", count=1000))
            if stale:                           # its copies' too
                self._client.delete(*stale)
        self._staged = self._staged or bool(context.extra.get("checkpoint"))
        for state in self._adopt:
            self._take_over(state)
        self._adopt = []

    def _prefix_of(self, op_id: str) -> str:
        """Staging lists of instance ``op_id`` are this plus the epoch (in the stream's cluster slot)."""
        return f"{{{self.stream}}}:pescheduler-staging:{op_id}:e"

    def _entries(self, batch: list) -> list:
        if self.fields:
            return [{k: str(v) for k, v in t.items()} for t in batch]
        encode = self.encode
        return [{FIELD: encode(t)} for t in batch]

    def process(self, batch: list, emit: Any) -> None:
        entries = self._entries(batch)          # a tuple that cannot be encoded fails before any write
        pipe = self._client.pipeline(transaction=False)
        if self._staged:
            import msgpack

            packed = [msgpack.packb([x for kv in e.items() for x in kv], use_bin_type=False) for e in entries]
            pipe.rpush(self._prefix + str(self._epochs.current), *packed)
            _or_fail(pipe.execute, f"redis sink: staging a batch for {self.stream}")
            return
        xadd, stream, maxlen = pipe.xadd, self.stream, self.maxlen
        for fields in entries:
            xadd(stream, fields, maxlen=maxlen, approximate=True)
        what = f"redis sink: writing a batch to {self.stream}"
        _or_fail(lambda: retried(what, pipe.execute, _transient()), what)

    # -- two-phase commit (called by checkpoints) ------------------------------------
    @serialized
    def pre_commit(self, checkpoint_id: int) -> None:
        """Seal the open epoch under ``checkpoint_id`` (already in Redis: durable as Redis is)."""
        for adopted in self._adopted:
            if adopted[0] is None:              # a copy's open epoch, taken over: this checkpoint's
                adopted[0] = checkpoint_id
        if not self._staged:
            self._staged = True                 # checkpoints began: stage from now on
            return
        self._epochs.seal(checkpoint_id, self._client.llen(self._prefix + str(self._epochs.current)))

    @serialized
    def commit(self, checkpoint_id: int) -> None:
        """Move the sealed epochs of ids up to ``checkpoint_id`` (with those of copies taken over)
        into the stream, oldest checkpoint first, atomically."""
        epochs = self._epochs.due(checkpoint_id)
        due = [(c, self._prefix + str(e)) for c, e, _n in epochs]
        taken = [a for a in self._adopted if a[0] is not None and a[0] <= checkpoint_id]
        due += [(c, key) for c, key in taken]
        if due:
            keys = [self.stream] + [key for _c, key in sorted(due, key=lambda d: d[0])]
            retried(f"redis sink: committing checkpoint {checkpoint_id} to {self.stream}",
                    lambda: self._publish(keys=keys, args=["" if self.maxlen is None else self.maxlen]), _transient())
        for _c, epoch, _n in epochs:            # confirmed by Redis: no longer pending
            self._epochs.published(epoch)
        self._adopted = [a for a in self._adopted if a not in taken]

    @serialized
    def abort(self, checkpoint_id: int) -> None:
        """Drop the sealed epochs of ``checkpoint_id`` and later (the stream replays them)."""
        gone = [self._prefix + str(e) for c, e, _n in self._epochs.pending if c >= checkpoint_id]
        self._epochs.pending = [p for p in self._epochs.pending if p[0] < checkpoint_id]
        gone += [key for c, key in self._adopted if c is not None and c >= checkpoint_id]
        self._adopted = [a for a in self._adopted if a[0] is None or a[0] < checkpoint_id]
        if gone:
            self._client.delete(*gone)

    @serialized
    def snapshot(self) -> dict:
        """The sealed epochs, and how many entries the open one holds (0 right after a barrier; a
        reconfiguration's snapshot in mid-epoch keeps what came before its marker)."""
        if self._client is None:
            return dict(self._state or {})
        opened = self._client.llen(self._prefix + str(self._epochs.current)) if self._staged else 0
        return {"op": self.context.op_id, "staged": self._staged, "epochs": self._epochs.state(), "open": opened,
                "adopted": [list(a) for a in self._adopted], "adopt": list(self._adopt)}

    def restore(self, state: dict | None) -> None:
        self._state = state if state and "epochs" in state else None
        self._adopted = [list(a) for a in (state or {}).get("adopted", [])]
        self._adopt = list((state or {}).get("adopt", []))

    def merge_states(self, states: list) -> dict:
        """The first instance's state taking over the others' (copies that go away): it publishes
        their staged lists with its own commits (:meth:`_take_over`)."""
        first, *others = states
        adopt = list(first.get("adopt", []))
        for state in others:
            if state and "epochs" in state:
                adopt += [{k: v for k, v in state.items() if k != "adopt"}] + list(state.get("adopt", []))
        return {**first, "adopt": adopt}

    def _take_over(self, state: dict) -> None:
        """A copy's staging as its snapshot left it, now this instance's to publish: its sealed
        epochs with their checkpoints, its open epoch (cut back to what it held then) with this
        instance's next one; what it staged after the snapshot is deleted (the stream replays it)."""
        prefix, epochs = self._prefix_of(state["op"]), Epochs.of(state["epochs"])
        if self._cut_back(prefix, epochs, state.get("open", 0)):
            self._adopted.append([None, prefix + str(epochs.current)])
        self._adopted += [[c, prefix + str(e)] for c, e, _n in epochs.pending]
        self._adopted += [list(a) for a in state.get("adopted", [])]

    def _reinstate(self, state: dict) -> None:
        """Staging as the snapshot left it: its sealed epochs wait for their commit; the open
        epoch is cut back to what it held then, later ones are deleted (the stream replays them)."""
        self._staged, self._epochs = state["staged"], Epochs.of(state["epochs"])
        self._cut_back(self._prefix, self._epochs, state.get("open", 0))

    def _cut_back(self, prefix: str, epochs: Epochs, kept: int) -> bool:
        """The lists under ``prefix`` as ``epochs`` knew them: later epochs deleted, the open one
        cut back to its first ``kept`` entries; whether it keeps any."""
        current = epochs.current
        self._discard(lambda epoch: not epochs.known(epoch) or (epoch == current and not kept), prefix)
        if kept:
            self._client.ltrim(prefix + str(current), 0, kept - 1)
        return bool(kept)

    def _discard(self, unwanted, prefix: str | None = None) -> None:
        prefix = prefix or self._prefix
        cut = len(prefix)
        names = (k.decode() for k in self._client.scan_iter(match=prefix + "*", count=1000))
        keys = [k for k in names if k[cut:].isdigit() and unwanted(int(k[cut:]))]
        if keys:
            self._client.delete(*keys)

    def flush(self, emit: Any) -> None:
        """End of stream: staged output is published (the stream's last checkpoint)."""
        if self._staged and self._client is not None:
            self.pre_commit(float("inf"))
            self.commit(float("inf"))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _transient() -> tuple:
    """Redis errors worth trying again: the connection went or an answer timed out."""
    import redis

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def _or_fail(call, what: str):
    """``call()``; a Redis error fails the PE (:class:`~pescheduler.errors.DeliveryFailed`):
    a staged write that may or may not have landed is not tried again, the restore cuts the
    staging back to its checkpoint instead."""
    import redis

    try:
        return call()
    except redis.exceptions.RedisError as exc:
        raise DeliveryFailed(f"{what} failed: {type(exc).__name__}: {exc}") from exc

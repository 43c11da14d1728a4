"""What the broker connectors share: value formats and per-partition event time.

A broker source reads several partitions (Kafka partitions, Redis streams)
whose event times advance independently. :class:`PartitionClock` keeps one
watermark per partition, as Flink's per-split watermarks do: the source's
watermark is the least of them, and a partition that delivered nothing for
``idle_timeout`` and has nothing waiting on the broker stops holding it back until it
delivers again.
"""

from __future__ import annotations

import json
from time import monotonic
from typing import Any, Callable

from pescheduler.operator import MIN_WATERMARK, Parallelism, Share, Source
from pescheduler.timeutil import parse_duration

_encode_json = json.JSONEncoder(separators=(",", ":"), default=str).encode
_decode_json = json.JSONDecoder().decode


def json_value(value: bytes) -> Any:
    """A JSON record value: UTF-8 text decoded first, half the cost of ``json.loads(bytes)``
    (which sniffs the encoding of every value)."""
    return _decode_json(value.decode())


def decoder(value_format: str | Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """bytes -> tuple for ``value_format``: ``"json"``, ``"bytes"`` or a callable."""
    if callable(value_format):
        return value_format
    if value_format == "json":
        return json_value
    if value_format == "bytes":
        return bytes
    raise ValueError(f"value_format must be 'json', 'bytes' or a callable, got {value_format!r}")


def encoder(value_format: str | Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """tuple -> bytes for ``value_format``: ``"json"`` (compact, ``default=str``), ``"bytes"`` or a callable."""
    if callable(value_format):
        return value_format
    if value_format == "json":
        return lambda t: _encode_json(t).encode()
    if value_format == "bytes":
        return bytes
    raise ValueError(f"value_format must be 'json', 'bytes' or a callable, got {value_format!r}")


class PartitionClock:
    """Per-partition watermarks with bounded out-of-orderness and idleness.

    ``seen(p, ts)`` after each record (or ``seen_max`` once per batch and
    partition); ``watermark()`` is ``min(max_ts[p]) - max_delay - 1`` over the
    partitions not idle. A partition that has not delivered anything yet counts
    as idle only once ``idle_timeout`` passed since it was assigned, so a slow
    start does not let event time run ahead of it.
    """

    def __init__(self, max_delay: int, idle_timeout_s: float, clock: Callable[[], float] = monotonic) -> None:
        self.max_delay = max_delay
        self.idle_timeout_s = idle_timeout_s
        self.clock = clock                        # seconds, monotonic (a test passes its own)
        self.max_ts: dict[Any, int] = {}
        self.active: dict[Any, float] = {}        # partition -> when it last delivered (or was assigned)

    def assign(self, partitions, max_ts: dict | None = None) -> None:
        now = self.clock()
        self.active = {p: now for p in partitions}
        self.max_ts = {p: (max_ts or {}).get(p, MIN_WATERMARK) for p in partitions}

    def seen_max(self, partition: Any, ts: int) -> None:
        if ts > self.max_ts.get(partition, MIN_WATERMARK):
            self.max_ts[partition] = ts
        self.active[partition] = self.clock()

    def watermark(self, behind: Callable[[Any], bool] | None = None) -> int | None:
        """The least watermark of the busy partitions; ``None`` if none is busy or none has data.

        ``behind(p)``: the broker holds records of ``p`` not read yet. Such a
        partition is never idle, however long it has been quiet: the reader
        is busy with the others' backlog, and its records are not late.
        """
        horizon = self.clock() - self.idle_timeout_s
        busy = [self.max_ts[p] for p, t in self.active.items()
                if t >= horizon or (behind is not None and behind(p))]
        if not busy or min(busy) == MIN_WATERMARK:
            return None
        return min(busy) - self.max_delay - 1


class PartitionedSource(Source):
    """A source whose numbered partitions pescheduler assigns to its instances (Kafka, Redis Streams).

    Keeps ``{partition: position}`` for every partition it knows (read or
    carried from a predecessor), the per-partition :class:`PartitionClock`,
    and its :class:`Share`. ``snapshot``/``restore`` move all three;
    ``merge_states``/``split_state`` gather and re-deal them when copies come
    or go. Subclasses set ``_positions`` as they read and map a partition to
    its number with ``_number`` (Kafka: the partition itself).
    """

    parallelism = Parallelism.STATELESS
    partitioned = True
    #: What it has not read waits at the broker, where any copy of what follows can take it: the
    #: PE reads it no further ahead than the credit window of the channel it feeds and one batch
    #: (worker/runtime.py ``SOURCE_BACKLOG``), not into a backlog behind one instance.
    backlog_elsewhere = True

    def __init__(self, *, idle_timeout: Any = "5s", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.share = Share()
        self._positions: dict = {}
        self._clock = PartitionClock(self.max_delay, parse_duration(idle_timeout) / 1000)
        self._saved_ts: dict = {}

    def _number(self, partition: Any) -> int:
        return partition

    def position(self) -> dict:
        """``{str(partition): position}`` of the partitions this instance reads (its :class:`Share`):
        the positions of all instances are disjoint and their union is the source's. Positions it
        only carries for a later re-split are left out, so a merge never lets a stale one win."""
        return {str(p): v for p, v in self._positions.items() if self.share(self._number(p))}

    def snapshot(self) -> dict:
        return {"positions": dict(self._positions), "max_ts": dict(self._clock.max_ts), "share": self.share}

    def restore(self, state: dict) -> None:
        self._positions = dict(state["positions"])
        self._saved_ts = dict(state.get("max_ts", {}))
        self.share = state.get("share", Share())

    def merge_states(self, states: list) -> dict:
        """Each instance's positions for the partitions it read win over those it only carried."""
        merged: dict = {"positions": {}, "max_ts": {}, "share": Share()}
        for owner in (False, True):
            for s in states:
                for key in ("positions", "max_ts"):
                    merged[key].update({p: v for p, v in s[key].items() if s["share"](self._number(p)) == owner})
        return merged

    def split_state(self, state: dict, owns: Share) -> dict:
        """Every position travels (a later re-split needs them all); ``owns`` says which to read."""
        return {**state, "share": owns}

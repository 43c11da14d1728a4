"""Built-in sources: ``iterable``, ``generator`` (synthetic connected cars), ``jsonl``.

Every source takes the common ``rate``, ``ts_field`` and ``max_delay``
arguments of :class:`pescheduler.operator.Source` and keeps its read position
in ``snapshot()``, so ``restore`` on a fresh instance with the same parameters
goes on where the first one stopped (moving a PE). Each also reports a small
JSON-safe ``position()`` that ``seek`` on a fresh instance rewinds to
(checkpoints): ``generator`` the event index, ``iterable`` the item offset
(lists, tuples, ranges; a one-shot iterator refuses), ``jsonl`` the file and
byte offset.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from itertools import islice, repeat
from typing import Any, Iterable

from pescheduler.errors import NotReplayable
from pescheduler.operator import Source


class IterableSource(Source):
    """Tuples from any iterable defined in the app: ``app.source("iterable", items=[...])``.

    A list, tuple or range is sliced per batch. A one-shot iterator (a
    generator) works too, but ``restore`` then needs it re-creatable: the new
    instance skips ``offset`` items of its own ``items``.

    Checkpoints: a sequence (list, tuple, range: anything indexable in a fixed
    order) is replayable, its position the number of items read. Anything
    else (a generator, an iterator, a set whose order differs between
    processes) raises :class:`~pescheduler.errors.NotReplayable` from
    ``position()``: it cannot be read again after a crash.
    """

    name = "iterable"

    def __init__(self, items: Iterable[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.items = items
        self._offset = 0
        self._iter = None

    def read(self, n: int) -> list | None:
        items, start = self.items, self._offset
        if isinstance(items, list):
            batch = items[start:start + n]
        elif isinstance(items, (tuple, range)):
            batch = list(items[start:start + n])
        else:
            if self._iter is None:
                self._iter = iter(items)
                _skip(self._iter, start)
            batch = list(islice(self._iter, n))
        if not batch:
            return None
        self._offset = start + len(batch)
        return batch

    def snapshot(self) -> dict:
        return {"offset": self._offset}

    def restore(self, state: dict) -> None:
        self._offset = state["offset"]
        self._iter = None

    def position(self) -> dict:
        if not isinstance(self.items, Sequence):
            raise NotReplayable(
                f"source 'iterable' over a {type(self.items).__name__} cannot rewind: a one-shot "
                f"iterator read after a checkpoint is gone after a crash; pass a list (or tuple, range) "
                f"as items=, write the data to a file for the 'jsonl' source, or deploy without checkpoint=")
        return {"offset": self._offset}

    def seek(self, position: dict) -> None:
        self.position()                     # refuses a one-shot iterator
        self.restore(position)


def _skip(iterator, n: int) -> None:
    for _ in islice(iterator, n):
        pass


class GeneratorSource(Source):
    """Synthetic connected-car events, deterministic for a seed.

    Each event is ``{"car": "car-0042", "speed": km/h, "lat": ..., "lon": ..., "ts": ms}``.
    Event ``i`` has ``ts = start_ts + i * interval_ms``, minus a jitter in
    ``[0, disorder_ms]`` when ``disorder_ms > 0`` (keep it below ``max_delay``
    so no event is late). ``events=None`` never ends.

    ``hotspots`` moves load over time: a list of phases, each
    ``{"from": event_index, "keys": [car ids] or n, "share": 0.8}``. From
    event ``from`` on (until the next phase), a ``share`` of the events go to
    the hot cars (``n`` meaning the first ``n`` cars, ``"car-0000"``...); the
    rest are spread uniformly over all ``keys`` cars, the hot ones included.
    ``share: 0`` ends hot-spotting. Example: a hot spot on 10 cars after 1 M
    events that moves to 5 others after 2 M::

        hotspots=[{"from": 1_000_000, "keys": 10, "share": 0.8},
                  {"from": 2_000_000, "keys": ["car-0100", "car-0101", "car-0102",
                                               "car-0103", "car-0104"], "share": 0.8}]

    The sequence is the same whatever batch sizes ``read`` is asked for: every
    event draws the same random numbers in the same order (jitter comes from
    a second stream for that reason).

    ``columnar=True`` yields the same events as ``pyarrow.RecordBatch`` es of
    ``columnar_rows`` rows (``car`` dictionary-encoded); numpy draws from the
    very Mersenne Twister state ``random.Random`` holds, so the values are
    bit-identical to the per-tuple events.
    """

    name = "generator"

    def __init__(self, events: int | None = None, keys: int = 10_000, seed: int = 0,
                 start_ts: int = 1_700_000_000_000, interval_ms: int = 1, disorder_ms: int = 0,
                 hotspots: list[dict] | None = None, columnar: bool = False,
                 columnar_rows: int = 65_536, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.columnar, self.columnar_rows = columnar, columnar_rows
        if events is not None and events < 0 or keys < 1 or interval_ms < 0 or disorder_ms < 0:
            raise ValueError(f"generator: need events >= 0 (or None), keys >= 1, interval_ms >= 0, "
                             f"disorder_ms >= 0; got events={events!r}, keys={keys!r}, "
                             f"interval_ms={interval_ms!r}, disorder_ms={disorder_ms!r}")
        self.events, self.keys, self.seed = events, keys, seed
        self.start_ts, self.interval_ms, self.disorder_ms = int(start_ts), int(interval_ms), int(disorder_ms)
        width = len(str(keys - 1))
        self.cars = [f"car-{i:0{width}d}" for i in range(keys)]
        self.phases = _phases(hotspots or [], self.cars)
        self._index = 0
        self._rng = random.Random(seed)
        self._jitter = random.Random(f"{seed}/disorder")

    def read(self, n: int) -> Any:
        if self.columnar:
            n = max(n, self.columnar_rows)
        start = self._index
        stop = start + n if self.events is None else min(start + n, self.events)
        if stop <= start:
            return None
        if self.columnar and not self.disorder_ms and not self._phase(start, stop)[2]:
            self._index = stop
            return self._columns(start, stop)
        batch: list = []
        while start < stop:                 # one segment per hot-spot phase crossed
            seg_stop, hot, share = self._phase(start, stop)
            batch += self._segment(start, seg_stop, hot, share)
            start = seg_stop
        if self.disorder_ms:
            jitter, span = self._jitter.random, self.disorder_ms + 1
            for e in batch:
                e["ts"] -= int(jitter() * span)
        self._index = stop
        return _record_batch(batch) if self.columnar else batch

    def _columns(self, start: int, stop: int) -> Any:
        """Events ``start..stop`` (no hot spot) as one RecordBatch, drawn by numpy from our MT state."""
        import numpy as np
        import pyarrow as pa

        with _numpy_twin(self._rng) as mt:
            draws = mt.random_sample(4 * (stop - start)).reshape(-1, 4)
        if not hasattr(self, "_car_dictionary"):
            self._car_dictionary = pa.array(self.cars)
        step = self.interval_ms
        ts0 = self.start_ts + start * step
        cars = np.minimum((draws[:, 0] * len(self.cars)).astype(np.int32), len(self.cars) - 1)
        return pa.RecordBatch.from_arrays(
            [pa.DictionaryArray.from_arrays(cars, self._car_dictionary), draws[:, 1] * 130.0,
             48.0 + draws[:, 2] * 0.3, 11.3 + draws[:, 3] * 0.5,
             np.arange(ts0, ts0 + (stop - start) * step, step, dtype=np.int64) if step
             else np.full(stop - start, ts0, dtype=np.int64)],
            names=["car", "speed", "lat", "lon", "ts"])

    def _phase(self, start: int, stop: int) -> tuple[int, list, float]:
        """The phase covering event ``start``: where it stops, its hot cars and share."""
        hot, share = [], 0.0
        for begin, phase_hot, phase_share in self.phases:
            if begin > start:
                return min(stop, begin), hot, share
            hot, share = phase_hot, phase_share
        return stop, hot, share

    def _segment(self, start: int, stop: int, hot: list, share: float) -> list:
        # Hot loop: locals bound once, one dict display per event. Each event
        # draws exactly four numbers (car, speed, lat, lon) whatever the phase.
        rnd, step = self._rng.random, self.interval_ms
        ts0 = self.start_ts + start * step
        stamps = range(ts0, ts0 + (stop - start) * step, step) if step else repeat(ts0, stop - start)
        cars, k = self.cars + self.cars[-1:], len(self.cars)     # spare entry: r * k may round to k
        if not share:
            return [{"car": cars[int(rnd() * k)], "speed": rnd() * 130.0,
                     "lat": 48.0 + rnd() * 0.3, "lon": 11.3 + rnd() * 0.5, "ts": ts}
                    for ts in stamps]
        hot_scale, cold_scale = len(hot) / share, k / (1.0 - share) if share < 1 else 0.0
        hot = hot + hot[-1:]
        return [{"car": hot[int(r * hot_scale)] if (r := rnd()) < share else cars[int((r - share) * cold_scale)],
                 "speed": rnd() * 130.0, "lat": 48.0 + rnd() * 0.3, "lon": 11.3 + rnd() * 0.5, "ts": ts}
                for ts in stamps]

    def snapshot(self) -> dict:
        return {"index": self._index, "rng": self._rng.getstate(), "jitter": self._jitter.getstate()}

    def restore(self, state: dict) -> None:
        self._index = state["index"]
        self._rng.setstate(state["rng"])
        self._jitter.setstate(state["jitter"])

    def position(self) -> dict:
        """The index of the next event (the random streams are re-derived from it by ``seek``)."""
        return {"index": self._index}

    def seek(self, position: dict) -> None:
        """Event ``index`` next: fresh random streams moved on by the draws of the events before
        it (four per event, one jitter each with ``disorder_ms``), at numpy's speed."""
        index = int(position["index"])
        if index == self._index:
            return                          # already there (a fresh instance at 0, or restored)
        self._rng, self._jitter = random.Random(self.seed), random.Random(f"{self.seed}/disorder")
        _advance(self._rng, 4 * index)
        if self.disorder_ms:
            _advance(self._jitter, index)
        self._index = index


class _numpy_twin:
    """``with _numpy_twin(rng) as mt``: a numpy ``RandomState`` on ``rng``'s very Mersenne Twister
    state, whose draws ``rng`` then continues after. ``random_sample`` consumes two 32-bit words
    per double exactly as ``random.random`` does, so the numbers are bit-identical."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def __enter__(self) -> Any:
        import numpy as np

        self.state = self.rng.getstate()
        self.mt = np.random.RandomState()
        self.mt.set_state(("MT19937", np.array(self.state[1][:-1], dtype=np.uint32), self.state[1][-1]))
        return self.mt

    def __exit__(self, *exc: Any) -> None:
        words, pos = self.mt.get_state()[1:3]
        self.rng.setstate((self.state[0], tuple(words.tolist()) + (int(pos),), None))


def _advance(rng: random.Random, draws: int) -> None:
    """Move ``rng`` on by ``draws`` calls of ``random()`` (in chunks: bounded memory)."""
    with _numpy_twin(rng) as mt:
        while draws > 0:
            chunk = min(draws, 1 << 22)
            mt.random_sample(chunk)
            draws -= chunk


def _record_batch(rows: list) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_pylist(rows)


def _phases(hotspots: list[dict], cars: list[str]) -> list[tuple[int, list, float]]:
    """Validate the hot-spot schedule into sorted ``(from, hot car ids, share)``."""
    phases = []
    for spec in hotspots:
        try:
            begin, keys, share = int(spec["from"]), spec.get("keys", []), float(spec["share"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"hotspot {spec!r}: expected {{'from': event_index, 'keys': [car ids] "
                             f"or n, 'share': 0..1}} ({exc})") from None
        hot = cars[:keys] if isinstance(keys, int) else [cars[c] if isinstance(c, int) else str(c)
                                                        for c in keys]
        if not 0.0 <= share <= 1.0 or (share and not hot):
            raise ValueError(f"hotspot {spec!r}: share must be in [0, 1] and needs at least one key")
        phases.append((begin, hot, share))
    return sorted(phases, key=lambda p: p[0])


class JsonlSource(Source):
    """One JSON object per line from ``path``, a file or a directory (its files in name order).

    With ``follow=True`` the source never ends: it returns what was appended
    since the last read (only complete lines) and picks up new files in the
    directory, as ``tail -F`` would; a file is left for the next one once a
    newer file exists and the old one is read to its end. Hidden files
    (``.name``) are skipped. A line that is not JSON stops the source with an
    error naming the file and line.
    """

    name = "jsonl"

    def __init__(self, path: str | os.PathLike, follow: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = os.fspath(path)
        self.follow = follow
        self._done: set[str] = set()        # files read to the end
        self._current: str | None = None
        self._offset = 0                    # bytes of complete lines consumed in _current
        self._line = 0
        self._fh = None

    def read(self, n: int) -> list | None:
        while True:
            if self._current is None and not self._next_file():
                return [] if self.follow else None
            lines = self._read_lines(n)
            if lines:
                batch = self._parse(lines)
                if batch:
                    return batch
                continue                    # only blank lines: read on
            if not self._advance():
                return []

    def _files(self) -> list[str]:
        if os.path.isdir(self.path):
            return [os.path.join(self.path, f) for f in sorted(os.listdir(self.path))
                    if not f.startswith(".") and os.path.isfile(os.path.join(self.path, f))]
        if self.follow and not os.path.exists(self.path):
            return []
        return [self.path]                  # missing and not followed: open() raises, naming it

    def _next_file(self) -> bool:
        for f in self._files():
            if f not in self._done:
                self._current, self._offset, self._line = f, 0, 0
                return True
        return False

    def _advance(self) -> bool:
        """The current file gave nothing: move to the next one, or False to wait (follow)."""
        if self.follow and not any(f not in self._done and f != self._current for f in self._files()):
            return False
        self._close_file()
        self._done.add(self._current)
        self._current = None
        return True

    def _read_lines(self, n: int) -> list[bytes]:
        """Up to ``n`` complete lines of the current file (a last partial one only when not following)."""
        if self._fh is None:
            self._fh = open(self._current, "rb")
            self._fh.seek(self._offset)
        lines = list(islice(self._fh, n))
        if self.follow and lines and not lines[-1].endswith(b"\n"):
            self._fh.seek(self._offset + sum(map(len, lines[:-1])))   # incomplete: wait for the rest
            lines.pop()
        self._offset += sum(map(len, lines))
        return lines

    def _parse(self, lines: list[bytes]) -> list:
        """Decode lines; a line that is not JSON is rejected (dead-lettered) with file:line."""
        first, loads = self._line, json.loads
        self._line += len(lines)
        try:
            return [loads(line) for line in lines if not line.isspace()]
        except ValueError:
            good = []
            for i, line in enumerate(lines):
                if line.isspace():
                    continue
                try:
                    good.append(loads(line))
                except ValueError as exc:
                    self.reject({"file": self._current, "line": first + i + 1,
                                 "text": line.decode(errors="replace").rstrip("\n")},
                                f"{self._current}:{first + i + 1}: not JSON ({exc})")
            return good

    def _close_file(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def close(self) -> None:
        self._close_file()

    def position(self) -> dict:
        """The files read to the end, the current one and the bytes of complete lines read in it
        (a partial last line of a followed file is not counted: it is read again whole)."""
        return {"done": sorted(self._done), "file": self._current, "offset": self._offset,
                "line": self._line}

    def seek(self, position: dict) -> None:
        self._close_file()
        self._done = set(position["done"])
        self._current, self._offset, self._line = position["file"], position["offset"], position["line"]

    snapshot = position
    restore = seek

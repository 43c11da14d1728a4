"""A source's event time: where it is in a tuple, in which unit, and what is not one.

Every source reads event time through one :class:`EventTime` (built by
:class:`~pescheduler.operator.Source` from its ``ts_field`` and ``ts_unit``),
so the generic sources (through the source driver) and the broker sources (in
their own per-partition read loops) agree on what a valid event time is and on
its normal form: milliseconds since the epoch. An event whose time is missing,
``None``, not a number, ``NaN`` or infinite raises :class:`BadEventTime`
with the reason; the caller dead-letters it, so a window is never fed a time
it cannot place (a ``NaN`` used to drop whole valid windows silently).

>>> EventTime("time", "s").millis({"time": 1.5})
1500
>>> EventTime("ts").millis({"ts": "2026-01-01T00:00:00Z"})
1767225600000
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any, Callable

#: Milliseconds per unit of a numeric event time.
UNITS = {"ms": 1, "s": 1000, "us": 1e-3, "ns": 1e-6}
#: Where the normalised event time is written: the field windows, joins and patterns read by default.
DEFAULT_FIELD = "ts"


class BadEventTime(ValueError):
    """An event without a usable event time; the message is the dead letter's reason."""


class EventTime:
    """Reads, checks and normalises the event time of a source's tuples.

    ``field``: a field name, a callable ``tuple -> time``, or ``None`` (no event
    time). ``unit``: the unit of a numeric time; ``datetime`` values and
    ISO-8601 strings carry their own. A time read from elsewhere than ``ts``,
    or not already a number of milliseconds, is written into ``ts`` as
    milliseconds, so every operator after the source finds event time where it
    looks by default, in the unit watermarks are in.
    """

    def __init__(self, field: str | Callable[[Any], Any] | None = DEFAULT_FIELD, unit: str = "ms") -> None:
        if unit not in UNITS:
            raise ValueError(f"ts_unit must be one of {', '.join(UNITS)}, got {unit!r}")
        if field is not None and not (isinstance(field, str) or callable(field)):
            raise ValueError(f"ts_field must be a field name, a callable or None, got {field!r}")
        self.field, self.unit, self.scale = field, unit, UNITS[unit]
        self._get = itemgetter(field) if isinstance(field, str) else field
        #: Times come as milliseconds in ``ts``: a batch of finite numbers needs no rewriting.
        self.plain = field == DEFAULT_FIELD and unit == "ms"

    def millis(self, t: Any) -> int | float:
        """``t``'s event time in milliseconds; BadEventTime (with the reason) when it has none."""
        try:
            raw = self._get(t)
        except (KeyError, IndexError, TypeError) as exc:
            raise BadEventTime(f"no event time: {self._name()} missing ({exc!r})") from None
        except Exception as exc:                      # a callable ts_field that raised
            raise BadEventTime(f"no event time: {self._name()} raised {exc!r}") from None
        return self.convert(raw)

    def convert(self, raw: Any) -> int | float:
        """A raw event time in milliseconds (see the class docstring); BadEventTime if it is none."""
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            if not math.isfinite(raw):
                raise BadEventTime(f"bad event time: {self._name()} is {raw!r}")
            return raw if self.scale == 1 else int(round(raw * self.scale))
        if isinstance(raw, datetime):
            return _epoch_millis(raw)
        if isinstance(raw, str):
            try:
                return _epoch_millis(datetime.fromisoformat(raw.replace("Z", "+00:00")))
            except ValueError:
                pass
        raise BadEventTime(f"bad event time: {self._name()} is {raw!r}, not a number of {self.unit}, "
                           f"a datetime or an ISO-8601 string")

    def stamp(self, batch: list) -> tuple[list, list, Any]:
        """``(valid tuples, [(tuple, reason)], largest time)`` of a batch, times normalised in place.

        Hot path: a batch of plain millisecond numbers is checked with C-speed
        builtins and left as it is; only a batch with anything else is walked
        tuple by tuple.
        """
        if self.plain:
            try:
                values = list(map(self._get, batch))
                if set(map(type, values)) <= {int, float} and math.isfinite(sum(values)):
                    return batch, [], max(values)
            except (KeyError, IndexError, TypeError):
                pass
        return self._stamp_each(batch)

    def stamp_columns(self, batch: Any) -> tuple[Any, list, Any]:
        """:meth:`stamp` for a ``pyarrow.RecordBatch`` from a columnar source: ``(the batch of
        the valid rows, [(row, reason)], largest time)``. A null, ``NaN`` or infinite time, or
        a batch without the column, is a dead letter with the reason, as on the rows path; the
        valid rows go on as one batch. Hot path: a batch with nothing wrong costs a null count
        (and one vectorised finiteness check for a float column)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.field not in batch.schema.names:
            reason = f"no event time: {self._name()} missing (not a column of the batch)"
            return batch.slice(0, 0), [(row, reason) for row in batch.to_pylist()], None
        times = batch.column(self.field)
        bad = pc.is_null(times)
        if pa.types.is_floating(times.type):
            bad = pc.or_(bad, pc.invert(pc.fill_null(pc.is_finite(times), True)))
        if times.null_count == 0 and not pc.any(bad).as_py():
            return batch, [], _whole(pc.max(times).as_py())
        kept = batch.filter(pc.invert(bad))
        rejected = [(row, f"bad event time: {self._name()} is {row.get(self.field)!r}")
                    for row in batch.filter(bad).to_pylist()]
        return kept, rejected, _whole(pc.max(kept.column(self.field)).as_py()) if kept.num_rows else None

    def stamp_one(self, t: Any) -> int | float:
        """``t``'s time in milliseconds, written back into ``t`` when it was in another form;
        BadEventTime when it has none (a broker source's per-record loop calls this)."""
        ms = self.millis(t)
        if not (self.plain and self._get(t) is ms):
            try:
                t[DEFAULT_FIELD] = ms
            except TypeError:                         # a tuple that is not a dict
                raise BadEventTime(f"event time in another form than ms needs dict events, "
                                   f"got {type(t).__name__}") from None
        return ms

    def _stamp_each(self, batch: list) -> tuple[list, list, Any]:
        kept, bad, top = [], [], None
        for t in batch:
            try:
                ms = self.stamp_one(t)
            except BadEventTime as exc:
                bad.append((t, str(exc)))
                continue
            kept.append(t)
            if top is None or ms > top:
                top = ms
        return kept, bad, top

    def _name(self) -> str:
        return repr(self.field) if isinstance(self.field, str) else "ts_field(event)"


def _whole(top: Any) -> Any:
    """A float column's largest time as whole milliseconds (watermarks travel as integers)."""
    return int(top) if isinstance(top, float) else top


def _epoch_millis(when: datetime) -> int:
    """Milliseconds since the epoch; a naive datetime is taken as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(round(when.timestamp() * 1000))

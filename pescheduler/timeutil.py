"""Durations as the user writes them ("60s", "500ms", "1.5min", 250) in milliseconds."""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*$")


def parse_duration(value: str | int | float) -> int:
    """Return ``value`` in whole milliseconds; a bare number is already milliseconds.

    >>> parse_duration("60s"), parse_duration("500ms"), parse_duration(250)
    (60000, 500, 250)
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a duration cannot be negative, NaN or infinite: {value!r}")
        return int(value)
    match = _PATTERN.match(str(value).lower())
    if not match or match.group(2) not in _UNITS and match.group(2) != "":
        raise ValueError(f"not a duration: {value!r} (write e.g. '60s', '500ms', '2min', or milliseconds)")
    number, unit = match.groups()
    return int(round(float(number) * _UNITS.get(unit or "ms", 1)))


def parse_offset(value: str | int | float) -> int:
    """A signed duration in whole milliseconds: an interval join's bound, ``"-5s"`` before the
    event or ``"2s"`` after it.

    >>> parse_offset("-5s"), parse_offset("0s"), parse_offset(-250)
    (-5000, 0, -250)
    """
    if isinstance(value, str) and value.strip().startswith("-"):
        return -parse_duration(value.strip()[1:])
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        return -parse_duration(-value)
    return parse_duration(value)

"""How a cost grows with the state, asserted as a ratio: honest on a loaded machine, where an
absolute time is not (the bounded-ratio tests of issue 30)."""

from __future__ import annotations

import statistics
from typing import Callable


def assert_grows_less(measure: Callable[[int], list[float]], what: str, keys: int = 10_000,
                      times: float = 3.0, floor_ms: float = 1.0) -> None:
    """``measure(k)``'s costs (ms) at ``10 * keys`` have a median under ``times`` their median at
    ``keys``; a median under ``floor_ms`` counts as ``floor_ms`` (noise). The message lists both."""
    small, big = measure(keys), measure(10 * keys)
    ratio = statistics.median(big) / max(statistics.median(small), floor_ms)
    assert ratio < times, (f"{what} ms at {keys:,} keys {[round(t, 2) for t in small]}, "
                           f"at {10 * keys:,} {[round(t, 2) for t in big]}: x{ratio:.1f}")

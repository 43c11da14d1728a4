"""How a cost grows with the state, asserted as a ratio: honest on a loaded machine, where an
absolute time is not (the bounded-ratio tests of issue 30)."""

from __future__ import annotations

from typing import Callable


def assert_grows_less(measure: Callable[[int], list[float]], what: str, keys: int = 10_000,
                      times: float = 3.0, floor_ms: float = 1.0) -> None:
    """``measure(k)``'s costs (ms) at ``10 * keys`` have a least under ``times`` their least at
    ``keys``; a least under ``floor_ms`` counts as ``floor_ms`` (noise). The message lists both.

    The least of each, as ``timeit`` takes it: what the work itself costs, the rest being other
    processes' (a median could set a loaded moment of the large size's runs against a quiet one
    of the small's: x3.3 against the bound of x3 in a run at load 13-15)."""
    small, big = measure(keys), measure(10 * keys)
    ratio = min(big) / max(min(small), floor_ms)
    assert ratio < times, (f"{what} ms at {keys:,} keys {[round(t, 2) for t in small]}, "
                           f"at {10 * keys:,} {[round(t, 2) for t in big]}: x{ratio:.1f}")

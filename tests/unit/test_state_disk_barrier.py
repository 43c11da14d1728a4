"""The disk backend's barrier step (``snapshot()``, on the PE's loop) does not grow with the state."""

from __future__ import annotations

import random
import time

import dask.config

from pescheduler.state import open_state
from growth import assert_grows_less

ROW = {"id": "car-0000000", "speed": 87.5, "lane": 3, "note": "x" * 120}     # ~180 bytes pickled


def _barrier_ms(root: str, k: int, rounds: int = 3) -> list[float]:
    """The time of ``snapshot()`` after the fill of ``k`` keys and after each of ``rounds`` rewrites
    of half of them: what it does in proportion to the state (RocksDB's checkpoint flushed the
    memtable, every key written since the last one) shows between 10^4 and 10^5 keys."""
    with dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": "512MB"}):
        state = open_state("disk", owner=f"barrier-{k}")
    keys, rng, out = [f"car-{i:07d}" for i in range(k)], random.Random(k), []
    try:
        for r in range(rounds + 1):
            for key in keys if r == 0 else rng.sample(keys, k // 2):
                state.put(key, {**ROW, "lane": r})
            t0 = time.perf_counter()
            view = state.snapshot()
            out.append(1000 * (time.perf_counter() - t0))
            view.release()
    finally:
        state.close()
    return out


def test_the_barrier_step_at_ten_times_the_keys_costs_less_than_three_times(tmp_path):
    assert_grows_less(lambda k: _barrier_ms(str(tmp_path), k), "snapshot()")

"""The disk backend's take (a rescale's ``take_groups``, in the PE's turn) does not grow with the
keys written: after a fill, with a checkpoint's view live and half the keys written since."""

from __future__ import annotations

import random
import time

import dask.config

from pescheduler.state import open_state
from pescheduler.state.groups import take_groups
from pescheduler.wire import KEY_GROUPS, key_group
from growth import assert_grows_less

ROW = {"id": "car-0000000", "speed": 87.5, "lane": 3, "note": "x" * 120}     # ~180 bytes pickled
ROUNDS = 4              # takes of a quarter of the groups each


def _take_ms(root: str, k: int) -> list[float]:
    """The PE thread's CPU time of each take after the fill of ``k`` keys, a checkpoint's barrier
    (a view the writer has not read yet) and a rewrite of half the
    keys still here: a take that reads, flushes or copies the keys written since the view or the
    fill shows between 10^4 and 10^5 keys. Each take's groups, read after it, hold the keys as
    they were at the take (written since: in the store, in the write-back buffer)."""
    with dask.config.set({"pescheduler.state.dir": root, "pescheduler.state.cache": "512MB"}):
        state = open_state("disk", owner=f"take-{k}")
    keys, rng, out = [f"car-{i:07d}" for i in range(k)], random.Random(k), []
    group_of = {key: key_group(key) for key in keys}
    model = {}
    try:
        for key in keys:
            state.put(key, {**ROW, "lane": 0})
            model[key] = {**ROW, "lane": 0}
        for r in range(ROUNDS):
            view = state.snapshot()
            here = [key for key in keys if group_of[key] % ROUNDS >= r]
            for key in rng.sample(here, len(here) // 2):
                state.put(key, {**ROW, "lane": r + 1})
                model[key] = {**ROW, "lane": r + 1}
            mine = frozenset(range(r, KEY_GROUPS, ROUNDS))
            t0 = time.thread_time()
            taken = take_groups(state, mine)
            out.append(1000 * (time.thread_time() - t0))
            got = {key: value for _g, (_first, packed) in taken.items() for key, value in packed.entries.items()}
            assert got == {key: value for key, value in model.items() if group_of[key] in mine}
            view.release()
        assert len(state) == 0
    finally:
        state.close()
    return out


def test_the_take_at_ten_times_the_keys_written_costs_less_than_three_times(tmp_path):
    assert_grows_less(lambda k: _take_ms(str(tmp_path), k), "take_groups CPU")

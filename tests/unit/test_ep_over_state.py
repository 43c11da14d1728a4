"""operators/ep_over.py: the over-window lanes keep each key's windows of every lane in the keyed
state backend (memory or disk); key groups move to a copy and back, a snapshot splits and
restores, a checkpoint of the old form (windows in a dict per lane) still restores: rows equal
an uninterrupted run's."""

from __future__ import annotations

import pickle
import random

import pytest

from pescheduler.operator import Emitter
from pescheduler.operators import OverLanes
from pescheduler.state import key_group, unpack_group

from keyed_handover import moved_to_a_copy_and_back, opened_as_a_pe, resume, rows

LANES = {30: {"c30": {"n": ("count", None)}}, 45: {"c45": {"n": ("count", None)}, "s45": {"s": ("sum", "a")}},
         20: {"lo": {"lo": ("min", "a")}}, 60: {"m": {"m": ("avg", "a"), "n": ("count", None)}}}


def events(seed: int, n: int = 900, keys: int = 8) -> list[dict]:
    """Keys that come and go (a key lives for a while, then others take over), ts one per event."""
    rnd = random.Random(seed)
    return [{"id": f"k{rnd.randrange(keys) + ts // 150 * 5}", "a": rnd.randrange(9), "ts": ts} for ts in range(n)]


def opened(state: dict | None = None) -> OverLanes:
    """The lanes of LANES, restored from ``state`` (when given) and opened (their windows then in
    the configured backend), as a PE makes it."""
    return opened_as_a_pe(OverLanes(key="id", lanes=LANES), "ep_over-1", state)


@pytest.mark.parametrize("batch", [1, 25])
def test_windows_live_in_the_backend_and_key_groups_moved_to_a_copy_and_back_give_every_row_once(backend, batch):
    out, whole = moved_to_a_copy_and_back(opened, lambda op: op._windows, events(1), batch,
                                          copy_of=opened)   # a new instance: from its part
    assert opened()._windows.backend == backend
    assert rows(out) == rows(whole) and len(whole) == 5 * len(events(1))


def old_form(state: dict) -> dict:
    """``state`` as a checkpoint held it before the windows were in the keyed state backend: each
    lane's snapshot of its own, with its keys' ``(key, events, slots)``."""
    values = {k: v for _g, (_k, data) in state["groups"].items() for k, v in unpack_group(bytes(data)).items()}
    lanes = {size: {**saved, "size": size, "watermark": state["watermark"], "pending": [],
                    "keys": [(k, list(v[size][0]), list(v[size][1])) for k, v in values.items() if size in v]}
             for size, saved in state["lanes"].items()}
    return {"watermark": state["watermark"], "pending": state["pending"], "lanes": lanes}


@pytest.mark.parametrize("form", ["groups", "old"])
def test_a_snapshot_split_in_two_restores_into_two_copies_that_go_on_as_one_would(backend, form):
    stream = events(2)
    whole = resume(opened(), stream, 10, start=-1)
    op = opened()
    out = resume(op, stream[:400], 10, start=-1)
    op.process(stream[400:405], Emitter())                  # waiting: the watermark is at 399
    state = pickle.loads(pickle.dumps(op.snapshot()))
    if form == "old":
        state = old_form(state)
    owns = [lambda k, r=r: key_group(k) % 2 == r for r in (0, 1)]
    rest: list = []
    for mine in owns:
        copy = opened(pickle.loads(pickle.dumps(op.split_state(state, mine))))
        held = copy._windows
        assert held.backend == backend and all(mine(k) for g in held.groups() for k, _ in held.items(g))
        rest += resume(copy, [e for e in stream[405:] if mine(e["id"])], 10, start=399)
    assert rows(out + rest) == rows(whole) and rest
    again = opened(op.merge_states([op.split_state(state, mine) for mine in owns]))    # and back to one
    assert rows(resume(again, stream[405:], 10, start=399)) == rows(rest)


def test_windows_quiet_for_a_lanes_size_are_forgotten(backend):
    """Keys come and go: a key's window of a lane is dropped once all its events are that lane's
    size behind the watermark, and the key once it has no window left (memory stays bounded)."""
    op = opened()
    stream = events(4, 2000)
    resume(op, stream, 50, start=-1)
    live = {e["id"] for e in stream if e["ts"] > 2000 - 1 - 2 * max(LANES)}
    held = {k for g in op._windows.groups() for k, _ in op._windows.items(g)}
    assert held and held <= live

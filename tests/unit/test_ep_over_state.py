"""operators/ep_over.py: the over-window lanes keep each key's windows of every lane in the keyed
state backend (memory or disk); key groups move to a copy and back, a snapshot splits and
restores, a checkpoint of the old form (windows in a dict per lane) still restores: rows equal
an uninterrupted run's."""

from __future__ import annotations

import pickle
import random

import dask
import pytest

from pescheduler.operator import Emitter, OperatorContext
from pescheduler.operators import OverLanes
from pescheduler.state import key_group, unpack_group

LANES = {30: {"c30": {"n": ("count", None)}}, 45: {"c45": {"n": ("count", None)}, "s45": {"s": ("sum", "a")}},
         20: {"lo": {"lo": ("min", "a")}}, 60: {"m": {"m": ("avg", "a"), "n": ("count", None)}}}


def events(seed: int, n: int = 900, keys: int = 8) -> list[dict]:
    """Keys that come and go (a key lives for a while, then others take over), ts one per event."""
    rnd = random.Random(seed)
    return [{"id": f"k{rnd.randrange(keys) + ts // 150 * 5}", "a": rnd.randrange(9), "ts": ts} for ts in range(n)]


def opened(state: dict | None = None) -> OverLanes:
    """The lanes of LANES, restored from ``state`` (when given) and opened (their windows then in
    the configured backend), as a PE makes it."""
    op = OverLanes(key="id", lanes=LANES)
    if state is not None:
        op.restore(state)
    op.open(OperatorContext(op_id="ep_over-1", pe_id="test", key_field="id", extra={}))
    return op


def resume(op: OverLanes, items: list, batch: int, start: int) -> list:
    """The rows ``op`` gives for ``items`` after watermark ``start``, driven as a chain would."""
    emit = Emitter()
    op.on_watermark(start, emit)
    for i in range(0, len(items), batch):
        part = items[i:i + batch]
        op.process(part, emit)
        op.on_watermark(part[-1]["ts"] - 1, emit)
    op.on_watermark(items[-1]["ts"] if items else start, emit)
    return list(emit)


def rows(out) -> list:
    return sorted(map(repr, out))


@pytest.fixture(params=["memory", "disk"])
def backend(request, tmp_path):
    with dask.config.set({"pescheduler.state.backend": request.param, "pescheduler.state.dir": str(tmp_path)}):
        yield request.param


@pytest.mark.parametrize("batch", [1, 25])
def test_windows_live_in_the_backend_and_key_groups_moved_to_a_copy_and_back_give_every_row_once(backend, batch):
    stream = events(1)
    whole = resume(opened(), stream, batch, start=-1)
    head, middle, tail = stream[:300], stream[300:600], stream[600:]
    op = opened()
    out = resume(op, head[:250], batch, start=-1)
    assert op._windows.backend == backend and len(op._windows) > 5
    moving = frozenset(g for g in op._windows.groups() if g % 2)
    settle = getattr(op, "settle_export", None)             # the hand-over's, then the turns before the export
    if settle is not None:
        settle()
    out += resume(op, head[250:], batch, start=249)
    copy = opened(pickle.loads(pickle.dumps(op.export_groups(moving))))   # a new instance: from its part
    assert moving.isdisjoint(op._windows.groups()) and set(copy._windows.groups()) <= moving
    mine = lambda e: key_group(e["id"]) in moving               # noqa: E731 - the copy's keys
    out += resume(copy, [e for e in middle if mine(e)], batch, start=299)
    out += resume(op, [e for e in middle if not mine(e)], batch, start=299)
    op.import_groups(pickle.loads(pickle.dumps(copy.export_groups(moving))))   # released: back to op
    out += resume(op, tail, batch, start=599)
    assert rows(out) == rows(whole) and len(whole) == 5 * len(stream)


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

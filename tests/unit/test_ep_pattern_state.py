"""operators/ep_pattern.py: the shared pattern queries keep each key's runs in the keyed state
backend (memory or disk); key groups move to a copy and back, a snapshot restores, and a
checkpoint of the old form (runs in a dict per family) still restores: rows equal an uninterrupted run."""

from __future__ import annotations

import pickle
import random

import pytest

from pescheduler import ep
from pescheduler.operator import Emitter
from pescheduler.state import unpack_group
from pescheduler.operators import SharedPatterns
from pescheduler.state import key_group

from keyed_handover import moved_to_a_copy_and_back, opened_as_a_pe, resume, rows


def jepc(i: int, within: int) -> dict:
    return {"pattern": "x y u", "within": within,
            "define": {"x": True, "y": ep.col("a") - ep.measure("z1") == i, "u": ep.col("a") - ep.measure("z2") == i},
            "do": {"x": {"z1": ep.col("a")}, "y": {"z2": ep.col("a")}}}


QUERIES = {**{f"q{i}": jepc(i, 30 + i) for i in range(3)},
           "plus": {"pattern": "x y+ u", "within": 40, "do": {"x": {"z": ep.col("a")}, "y": {"z": ep.col("a")}},
                    "define": {"x": ep.col("a") < 3, "y": ep.col("a") >= ep.measure("z"), "u": ep.col("b") == 0}}}


def events(seed: int, n: int = 900, keys: int = 8) -> list[dict]:
    """Keys that come and go (a key lives for a while, then others take over), ts one per event."""
    rnd = random.Random(seed)
    return [{"id": f"k{rnd.randrange(keys) + ts // 150 * 5}", "a": rnd.randrange(5), "b": rnd.randrange(3), "ts": ts}
            for ts in range(n)]


def opened(state: dict | None = None) -> SharedPatterns:
    """The shared patterns of QUERIES, restored from ``state`` (when given) and opened (its state
    then in the configured backend), as a PE makes it."""
    return opened_as_a_pe(SharedPatterns(key="id", queries=QUERIES), "ep_patterns-1", state)


def imported(export):
    """A copy opened in the backend, then given the groups (as a Replicate's new instance is)."""
    copy = opened()
    copy.import_groups(export)
    return copy


@pytest.mark.parametrize("batch", [1, 25])
def test_runs_live_in_the_backend_and_key_groups_moved_to_a_copy_and_back_give_every_row_once(backend, batch):
    out, whole = moved_to_a_copy_and_back(opened, lambda op: op._runs, events(1), batch, copy_of=imported)
    assert opened()._runs.backend == backend
    assert rows(out) == rows(whole) and len(whole) > 100


def old_form(state: dict) -> dict:
    """``state`` as a checkpoint held it before the runs were in the keyed state backend: each
    family's runs in a dict of its own, ``(shape, {key: runs}, births)``."""
    from pescheduler.operators.ep_pattern import family_id

    values = {k: v for _g, (_k, data) in state["groups"].items() for k, v in unpack_group(bytes(data)).items()}
    families = [(shape, {k: v[family_id(shape)] for k, v in values.items() if family_id(shape) in v}, born)
                for shape, born in state["families"]]
    return {k: v for k, v in state.items() if k != "groups"} | {"families": families}


@pytest.mark.parametrize("form", ["groups", "old"])
def test_a_snapshot_split_in_two_restores_into_two_copies_that_go_on_as_one_would(backend, form):
    """A checkpoint taken mid-stream (events waiting for the watermark, runs half-way), split by
    key group and restored into two instances (a restore at another parallelism); also one of
    the old form. The rows are those of the uninterrupted run, each once."""
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
        part = pickle.loads(pickle.dumps(op.split_state(state, mine)))
        copy = opened(part)
        assert copy._runs.backend == backend and all(mine(k) for g in copy._runs.groups() for k, _ in copy._runs.items(g))
        rest += resume(copy, [e for e in stream[405:] if mine(e["id"])], 10, start=399)
    assert rows(out + rest) == rows(whole) and rest
    again = opened(op.merge_states([op.split_state(state, mine) for mine in owns]))    # and back to one
    assert rows(resume(again, stream[405:], 10, start=399)) == rows(rest)


def test_an_export_splits_into_slices_that_import_one_by_one(backend):
    """A hand-over sends a large export in slices of key groups (worker/handover.py: ``split_state``
    of the export): each slice imports, and the copy goes on as the whole would."""
    stream = events(3)
    op = opened()
    resume(op, stream[:300], 10, start=-1)
    op.process(stream[300:303], Emitter())                  # waiting: the watermark is at 299
    export = op.export_groups(frozenset(op._runs.groups()) | {key_group(e["id"]) for e in stream[300:303]})
    halves = [pickle.loads(pickle.dumps(op.split_state(export, lambda k, h=h: key_group(k) % 2 == h))) for h in (0, 1)]
    copy = opened(halves[0])                                # a new instance: restored from its first part
    copy.import_groups(halves[1])
    assert len(copy._pending) == 3 and len(op._runs) == 0
    whole = opened()
    resume(whole, stream[:300], 10, start=-1)
    whole.process(stream[300:303], Emitter())
    assert rows(resume(copy, stream[303:], 10, start=299)) == rows(resume(whole, stream[303:], 10, start=299))

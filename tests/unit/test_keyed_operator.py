"""pescheduler/state/operator.py: an operator of your own that names its keyed states
(``KeyedOperator``) is checkpointed, restored, split, merged and rescaled by key group with nothing
more written, on both backends; a rescale takes only its moving key groups."""

from __future__ import annotations

import pickle

import pytest

from pescheduler import Parallelism
from pescheduler.operator import OperatorContext
from pescheduler.state import KeyedOperator, MemoryState, key_group
from pescheduler.state.incremental import pickle_snapshot
from pescheduler.worker import handover

from keyed_handover import moved_to_a_copy_and_back, opened_as_a_pe, resume, round_trip, rows
from support_ops import KeptSum

STREAM = [{"id": f"k{i % 37}", "n": i, "ts": i} for i in range(900)]


def opened(state: dict | None = None) -> KeptSum:
    return opened_as_a_pe(KeptSum(), "kept_sum-1", state)


def imported(export: dict) -> KeptSum:
    """A copy opened in the backend, then given the groups (as a Replicate's new instance is)."""
    copy = opened()
    copy.import_groups(export)
    return copy


@pytest.mark.parametrize("batch", [1, 25])
def test_its_key_groups_move_to_a_copy_and_back_and_every_row_comes_once(backend, batch):
    out, whole = moved_to_a_copy_and_back(opened, lambda op: op.sums, STREAM, batch, copy_of=imported)
    op = opened()
    assert op.sums.backend == op.seen.backend == backend
    assert rows(out) == rows(whole) and len(whole) == len(STREAM)


def test_a_rescale_takes_only_the_moving_groups_never_the_whole_state(backend):
    """``worker/handover.py`` exports and imports through the operator's own hooks: neither its
    ``snapshot`` nor its ``restore`` (the whole state taken apart in the PE's turn, a pause that
    grows with it) is called, and the groups that stay are where they were."""
    op, copy = opened(), opened()
    resume(op, STREAM[:400], 50, start=-1)

    def whole(*_args):
        raise AssertionError("the whole state was taken apart for a rescale")
    for instance in (op, copy):
        instance.snapshot = instance.restore = whole
    moving = frozenset(g for g in op.sums.groups() if g % 2)
    staying = {g: dict(op.sums.items(g)) for g in op.sums.groups() if g not in moving}
    part = round_trip(handover.export_groups(op, moving))
    handover.import_groups(copy, part)
    assert {g: dict(op.sums.items(g)) for g in op.sums.groups()} == staying
    assert set(copy.sums.groups()) == set(copy.seen.groups()) == moving
    for n in (0, 1, 399):
        k = STREAM[n]["id"]
        held = copy if key_group(k) in moving else op
        assert held.seen.get(k) == sum(1 for e in STREAM[:400] if e["id"] == k)


def test_a_checkpoint_holds_each_keyed_state_as_key_groups_and_restores_at_another_parallelism(backend):
    """The snapshot is one view per keyed state (what a checkpoint writes incrementally, off the
    PE's loop); split in two by key group, restored into two instances and merged back into one, it
    gives the rows of the uninterrupted run."""
    whole = resume(opened(), STREAM, 25, start=-1)
    op = opened()
    out = resume(op, STREAM[:500], 25, start=-1)
    snapshot = op.snapshot()
    _blob, views = pickle_snapshot(snapshot)
    assert len(views) == 2                              # sums and seen, each its key groups
    saved = pickle.loads(pickle.dumps(snapshot))
    odd = lambda key: key_group(key) % 2 == 1          # noqa: E731
    halves = [op.split_state(saved, odd), op.split_state(saved, lambda key: not odd(key))]
    first, second = opened(halves[0]), opened(halves[1])
    rest = STREAM[500:700]
    out += resume(first, [e for e in rest if odd(e["id"])], 25, start=499)
    out += resume(second, [e for e in rest if not odd(e["id"])], 25, start=499)
    merged = op.merge_states([round_trip(first.snapshot()), round_trip(second.snapshot())])
    out += resume(opened(merged), STREAM[700:], 25, start=699)
    assert rows(out) == rows(whole)


def test_a_snapshot_without_one_of_its_states_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"holds no keyed state named 'seen' \(it holds 'sums'\)"):
        KeptSum().restore({"sums": {}})


@pytest.mark.parametrize("body, message", [
    ({}, r"Bad.keyed_states must be a tuple of distinct attribute names, such as \('counts',\); got \(\)"),
    ({"keyed_states": "counts"}, r"keyed_states must be a tuple .* got 'counts'"),
    ({"keyed_states": ("a", "a")}, r"keyed_states must be a tuple .* got \('a', 'a'\)"),
    ({"keyed_states": ("a",), "parallelism": Parallelism.STATELESS}, r"Bad: a KeyedOperator is KEYED"),
])
def test_a_wrong_declaration_is_refused_when_the_operator_is_made(body, message):
    cls = type("Bad", (KeyedOperator,), {"name": "bad", "process": lambda self, b, e: None, **body})
    with pytest.raises(TypeError, match=message):
        cls()


def test_a_keyed_state_replaced_by_something_else_is_refused_at_open_naming_it():
    op = KeptSum()
    op.seen = {}
    with pytest.raises(TypeError, match="seen is a dict"):
        op.open(OperatorContext(op_id="kept_sum-1", key_field="id"))
    assert isinstance(KeptSum().seen, MemoryState)      # as made: restore() may come before open()

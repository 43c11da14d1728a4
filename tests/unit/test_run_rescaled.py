"""pescheduler/testing.py's ``run_rescaled``: an operator author's check that a KEYED operator's state
goes through a checkpoint, a restore, a Replicate's move and a Release's move back; it tells an
operator that keeps its state where those carry it from one that keeps some elsewhere."""

from __future__ import annotations

import pytest

from pescheduler import Operator, Parallelism
from pescheduler.state import KeyedOperator
from pescheduler.testing import run_rescaled

from support_ops import KeptSum, RunningSum

ITEMS = [{"key": f"k{i % 37}", "n": i, "ts": i} for i in range(900)]


class SumAndLast(KeyedOperator):
    """A keyed state, and a dict of each key's last ``n`` beside it: the dict is not carried."""

    name = "sum_and_last"
    keyed_states = ("sums",)

    def __init__(self) -> None:
        self.last: dict = {}

    def process(self, batch, emit):
        for t in batch:
            k = t["key"]
            total = self.sums.get(k, 0) + t["n"]
            self.sums.put(k, total)
            emit({"key": k, "sum": total, "before": self.last.get(k)})
            self.last[k] = t["n"]


class FiresAtTheEnd(Operator):
    """Counts per key in a dict, emitted at the end of the stream only: its snapshot, split and
    merge written by hand (no export_groups: a move takes the whole state apart)."""

    name = "fires_at_the_end"
    parallelism = Parallelism.KEYED

    def __init__(self) -> None:
        self.counts: dict = {}

    def process(self, batch, emit):
        for t in batch:
            self.counts[t["key"]] = self.counts.get(t["key"], 0) + 1

    def flush(self, emit):
        emit.many({"key": k, "count": n} for k, n in self.counts.items())

    def snapshot(self):
        return dict(self.counts)

    def restore(self, state):
        self.counts = dict(state)

    def split_state(self, state, owns):
        return {k: v for k, v in state.items() if owns(k)}

    def merge_states(self, states):
        return {k: v for s in states for k, v in s.items()}


@pytest.mark.parametrize("make", [KeptSum, RunningSum, FiresAtTheEnd], ids=lambda m: m.__name__)
def test_an_operator_whose_state_is_carried_gives_every_row_once(backend, make):
    result = run_rescaled(ITEMS, make, key="key", batch_size=25)
    assert result.same and len(result.whole) == (37 if make is FiresAtTheEnd else len(ITEMS))
    assert len(result.moved) > 5


def test_state_kept_beside_the_keyed_states_is_found_lost(backend):
    result = run_rescaled(ITEMS, SumAndLast, key="key", batch_size=25)
    assert not result.same
    assert sorted(map(repr, (r for r in result.output if r["before"] is None))) != \
        sorted(map(repr, (r for r in result.whole if r["before"] is None)))      # keys that "forgot" their last


def test_no_items_is_refused():
    with pytest.raises(ValueError, match="no items"):
        run_rescaled([], KeptSum, key="key")

"""The operator contract's parallelism parts.

MERGEABLE copies: a copy's partials reach the original through ``absorb``, whose default
merges them with ``combine``, so an operator with ``take_partials`` and ``combine`` is copyable.
``per_instance``: the one way a parallelism differs between instances of a class."""

from __future__ import annotations

import pytest

from pescheduler import Emitter, Operator, Parallelism
from pescheduler.testing import CollectingOutput, RunResult, run_operators
from pescheduler.worker.chain import Chain

SIZE = 10


class Counts(Operator):
    """Tuples per tumbling window of ``SIZE`` ms; state and partials are both ``{window: count}``."""

    name = "counts"
    parallelism = Parallelism.MERGEABLE

    def __init__(self):
        self.counts = {}

    def process(self, batch, emit):
        for t in batch:
            w = t["ts"] - t["ts"] % SIZE
            self.counts[w] = self.counts.get(w, 0) + 1

    def _closed(self, watermark):
        return sorted(w for w in self.counts if watermark is None or w + SIZE - 1 <= watermark)

    def on_watermark(self, watermark, emit):
        for w in self._closed(watermark):
            emit({"window": w, "count": self.counts.pop(w)})

    def take_partials(self, watermark):
        return [{w: self.counts.pop(w) for w in self._closed(watermark)}]

    def snapshot(self):
        return dict(self.counts)

    def restore(self, state):
        self.counts = dict(state)

    @classmethod
    def combine(cls, partials):
        merged = {}
        for part in partials:
            for w, c in part.items():
                merged[w] = merged.get(w, 0) + c
        return merged


EVENTS = [{"ts": ts} for ts in range(0, 60, 3)]


def test_the_original_merges_a_copys_partials_with_combine_and_fires_what_one_instance_would():
    alone = run_operators(EVENTS, Counts(), ts_field="ts", max_delay=0).output
    result = RunResult()
    # "a" feeds the original, "b" its copy; the copy's partials go to the original
    chain = Chain({"counts": Counts(), "counts#1": Counts()},
                  [("a", "out", "counts"), ("b", "out", "counts#1"), ("counts#1", "out", "counts")],
                  {("counts", "out"): [CollectingOutput(result)]}, copies={"counts#1": "counts"})
    chain.emit_from("a", EVENTS[::2])
    chain.emit_from("b", EVENTS[1::2])
    chain.watermark_from("a", 29)
    chain.watermark_from("b", 29)
    assert result.output == [r for r in alone if r["window"] < 30]      # partials absorbed before firing
    chain.end_from("a")
    chain.end_from("b")
    assert result.output == alone and len(alone) == 6


def test_absorb_without_combine_says_what_to_implement():
    class Plain(Operator):
        name = "plain"
        parallelism = Parallelism.MERGEABLE

    with pytest.raises(NotImplementedError, match="implement absorb or combine"):
        Plain().absorb([], Emitter())


def test_per_instance_parallelism_is_planned_from_the_class_and_read_from_each_instance():
    from pescheduler.operator import OperatorContext
    from pescheduler.operators.pattern import Pattern
    from pescheduler.plugins import load_plugins

    assert Pattern.parallelism is Parallelism.KEYED                  # what the planner plans with
    assert load_plugins().operator("pattern") is Pattern
    op = Pattern("x", define={"x": lambda e, m: True})
    assert op.parallelism is Parallelism.SINGLETON                   # no key yet: one sequence
    op.open(OperatorContext(op_id="pattern-1", key_field="k"))
    assert op.parallelism is Parallelism.KEYED
    with pytest.raises(AttributeError, match="derived per instance"):
        op.parallelism = Parallelism.STATELESS

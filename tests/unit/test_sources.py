"""A PE's sources as one (worker/source_driver.py ``Sources``), driven directly: which are read in
a turn, when the next is due, pausing, draining, snapshot and restore."""

from __future__ import annotations

from test_source_pump import Trickle

from pescheduler.operators.basic import Map
from pescheduler.testing import CollectingOutput, RunResult
from pescheduler.worker.chain import Chain
from pescheduler.worker.source_driver import SOURCE_POLL_S, Sources


def _two_sources(reads_a, reads_b):
    ops = {"a": Trickle(reads_a), "b": Trickle(reads_b), "m": Map(lambda t: t)}
    result = RunResult()
    chain = Chain(ops, [("a", "out", "m"), ("b", "out", "m")], {("m", "out"): [CollectingOutput(result)]})
    return Sources(ops, 100), chain, result


def test_only_the_sources_not_held_back_and_not_paused_are_read():
    sources, chain, result = _two_sources([[{"x": 1, "ts": 1}]] * 3, [[{"x": 2, "ts": 2}]] * 3)
    assert [d.op_id for d in sources] == ["a", "b"], "the operators that are sources, in order"
    assert sources.pump(chain, held=lambda d: d.op_id == "b")
    assert [t["x"] for t in result.output] == [1]
    sources.pause()
    assert not sources.pump(chain, held=lambda d: False) and sources.due_in(lambda d: False) == []
    sources.pause(False)
    assert sources.pump(chain, held=lambda d: False)
    assert [t["x"] for t in result.output] == [1, 1, 2]


def test_an_empty_source_is_due_again_at_its_poll_and_a_held_one_not_at_all():
    sources, _chain, _result = _two_sources([[]], [[]])
    assert sources.due_in(lambda d: d.op_id == "b") == [SOURCE_POLL_S]


def test_a_drain_ends_every_live_source_at_its_next_read():
    sources, chain, _result = _two_sources([[{"x": 1, "ts": 1}]] * 3, [[{"x": 2, "ts": 2}]] * 3)
    assert sources.drain()
    sources.pump(chain, held=lambda d: False)
    assert all(d.ended for d in sources) and chain.finished
    assert not sources.drain(), "none left live"


def test_each_driver_takes_back_its_own_progress_from_a_snapshot():
    sources, chain, _result = _two_sources([[{"x": 1, "ts": 10}], []], [[{"x": 2, "ts": 20}], []])
    sources.pump(chain, held=lambda d: d.op_id == "b")
    saved = sources.snapshot()
    again, _chain, _result = _two_sources([[]], [[]])
    again.restore({op_id: {"driver": s} for op_id, s in saved.items() if op_id == "a"})
    assert [(d.count, d.max_ts) for d in again] == [(1, 10), (0, saved["b"]["max_ts"])]

"""The first output after a restore is seen on the worker that has it, whatever the others answer.

The check asks every worker of the restored placement for its PEs' counters. It asked them in one
gather, so one worker whose answer did not come within ``calls.worker`` (a loaded worker, one lost
since) failed the whole look, and the sink's count on another worker went unseen; a restart then
had no ``first_output_s`` (the Kafka crash-before-commit test, load 12: "no restart with output
within 120 s")."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pescheduler.control import recovery as recovery_module
from pescheduler.control.gateway import WorkerGateway
from pescheduler.control.recovery import Recovery


class _Gateway:
    """``stats`` for one worker at a time: ``slow`` never answers in time, ``sink`` has output;
    ``stats_each`` the real one, over this ``stats``."""

    stats_each = WorkerGateway.stats_each

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def stats(self, workers, dead_letters=True, acked=None):
        workers = list(workers)
        self.asked.append(workers)
        if "tcp://slow" in workers:
            raise asyncio.TimeoutError()
        return [{"pes": {"pe-sink": {"operators": {"sink-3": {"tuples_in": 5}}}}} for w in workers
                if w == "tcp://sink"]


def _deployment(gateway, events: list, done: bool = False) -> SimpleNamespace:
    """A deployment as ``Recovery._first_output`` reads it: its gateway, whether it is done, and its
    events (their texts into ``events``)."""
    ended = asyncio.Event()
    if done:
        ended.set()
    return SimpleNamespace(id="d", reconfigurer=SimpleNamespace(), gateway=gateway, _done=ended,
                           state=SimpleNamespace(event=lambda kind, text: events.append(text)))


def _placement(source: bool = True) -> SimpleNamespace:
    """A restored placement: ``sink-3`` in ``pe-sink`` on ``tcp://sink`` and (``source``)
    ``src-1`` in ``pe-src`` on ``tcp://slow``."""
    ops, pes = {"sink-3": SimpleNamespace(kind="sink")}, {"pe-sink": SimpleNamespace(worker="tcp://sink")}
    if source:
        ops["src-1"], pes["pe-src"] = SimpleNamespace(kind="source"), SimpleNamespace(worker="tcp://slow")
    return SimpleNamespace(plan=SimpleNamespace(ops=ops), pes=pes)


def _look(dep: SimpleNamespace, record: dict, placement: SimpleNamespace) -> None:
    """The recovery's look for a first output, bounded."""
    asyncio.run(asyncio.wait_for(Recovery(dep, strategy=None)._first_output(record, 0.0, placement), 10))


def test_a_worker_that_does_not_answer_does_not_hide_the_sinks_first_output_on_another(monkeypatch):
    monkeypatch.setattr(recovery_module, "FIRST_OUTPUT_S", 1.0)      # the look's bound: not 120 s here
    events, gateway, record = [], _Gateway(), {"attempt": 1}
    _look(_deployment(gateway, events), record, _placement())
    assert "first_output_s" in record, f"the sink's output on tcp://sink went unseen: {events}"
    assert ["tcp://slow"] in gateway.asked and ["tcp://sink"] in gateway.asked


def test_a_first_output_not_seen_says_which_sinks_took_nothing_and_which_workers_did_not_answer(monkeypatch):
    """None within the look's bound: the record and the event name the sink that took no tuple on
    the worker that answered, and the worker that did not answer with its error ("not seen" alone,
    in a loaded suite's Kafka restart, could not tell a stopped stream from a silent worker)."""
    monkeypatch.setattr(recovery_module, "FIRST_OUTPUT_S", 0.3)
    events = []

    class _Idle(_Gateway):
        async def stats(self, workers, dead_letters=True, acked=None):
            workers = list(workers)
            if "tcp://slow" in workers:
                raise asyncio.TimeoutError()
            return [{"pes": {"pe-sink": {"operators": {"sink-3": {"tuples_in": 0}}}}} for w in workers]

    record = {"attempt": 1, "checkpoint": 2, "restore_s": 0.9}
    _look(_deployment(_Idle(), events), record, _placement())
    assert "first_output_s" not in record
    assert record["first_output_missing"] == ("no tuple into sink-3 on the workers that answered; "
                                              "no answer from tcp://slow: TimeoutError()"), record
    assert len(events) == 1 and "first output not seen within" in events[0] and \
        record["first_output_missing"] in events[0], events


def test_a_deployment_that_ends_before_a_first_output_says_so_and_asks_nobody(monkeypatch):
    """Ended before the look: the record says the deployment ended first, not that a sink took
    nothing (nobody was asked)."""
    monkeypatch.setattr(recovery_module, "FIRST_OUTPUT_S", 5.0)
    gateway, record = _Gateway(), {"attempt": 1}
    _look(_deployment(gateway, [], done=True), record, _placement(source=False))
    assert record["first_output_missing"] == "the deployment ended first" and gateway.asked == [], record

"""The stall detector's verdicts on monitor rounds (control/stall.py); the real path is
tests/integration/test_stall_live.py."""

from __future__ import annotations

from pescheduler.control.stall import StallDetector, waits


def answer(tuples: int, queued: int, pending: int, credits: int = 0) -> list[dict]:
    return [{"pes": {
        "a": {"state": "running", "queue_batches": 0, "operators": {"src": {"tuples_in": 0, "tuples_out": tuples}},
              "channels_out": {"d/1/src.out->b": {"tuples": tuples, "batches": tuples, "credits": credits,
                                                  "pending": pending}},
              "channels_in": {"d/1/b2.out->a": {"tuples": 0}}},
        "b": {"state": "running", "queue_batches": queued, "operators": {"b1": {"tuples_in": tuples, "tuples_out": 0}},
              "channels_out": {"d/1/b2.out->a": {"tuples": 0, "batches": 0, "credits": 0, "pending": pending}},
              "channels_in": {"d/1/src.out->b": {"tuples": tuples}}}}}]


def test_no_progress_with_input_pending_stalls_then_fails_and_progress_clears():
    d = StallDetector(timeout_s=10)
    assert d.observe(answer(5, 2, 3), now=0) is None
    assert d.observe(answer(5, 2, 3), now=9) is None
    assert d.observe(answer(5, 2, 3), now=10) == "stalled"
    assert d.observe(answer(6, 2, 3), now=12) == "cleared"          # progress
    assert d.observe(answer(6, 2, 3), now=22) == "stalled"
    assert d.observe(answer(6, 2, 3), now=31) is None
    assert d.observe(answer(6, 2, 3), now=32) == "failed"


def test_an_idle_pipeline_or_a_reconfiguration_is_no_stall():
    d = StallDetector(timeout_s=1)
    assert d.observe(answer(5, 0, 0), now=0) is None
    assert d.observe(answer(5, 0, 0), now=100) is None              # nothing pending: waiting for input
    assert d.observe(answer(5, 1, 0), now=200, reconfiguring=True) is None
    assert d.observe(answer(5, 1, 0), now=200.5) is None
    assert d.observe(answer(5, 1, 0), now=201.5) == "stalled"


def test_the_event_names_who_waits_on_whom_and_the_cycle():
    lines = waits(answer(5, 2, 3))
    assert lines[0].startswith("a -[d/1/src.out->b]-> b (no credit, 3 buffered; b has 2 batches queued)")
    assert lines[1].startswith("b -[d/1/b2.out->a]-> a")
    assert "wait cycle: a -> b -> a" in lines
    assert "input queued at: b (2 batches queued)" in lines

"""dead-letters.max-ratio judged while a run runs (after judge-after tuples) and at its end."""

from pescheduler.control.deadletters import DeadLetters
from pescheduler.metrics import MetricsSnapshot, OperatorMetrics


def snapshot(**ops):
    return MetricsSnapshot(0.0, 1.0, operators={op: OperatorMetrics(op, "pe-1", tuples_in=n_in, tuples_out=n_out)
                                                for op, (n_in, n_out) in ops.items()})


def dead(op: str, n: int) -> DeadLetters:
    letters = DeadLetters()
    for _ in range(n):
        letters.keep({"op": op, "item": {"repr": "x"}, "error": "bad event time"})
    return letters


def test_a_source_that_dead_letters_everything_is_judged_while_running():
    verdict = dead("generator-1", 1200).verdict(snapshot(**{"generator-1": (0, 0)}), running=True)
    assert verdict.startswith("generator-1 dead-lettered 1200 of 1200 tuples (100%, more than "
                              "pescheduler.dead-letters.max-ratio 0.5)")


def test_a_first_handful_is_no_ratio_while_running_but_counts_at_the_end():
    letters, snap = dead("map-2", 3), snapshot(**{"map-2": (4, 1)})
    assert letters.verdict(snap, running=True) is None
    assert "map-2 dead-lettered 3 of 4 tuples" in letters.verdict(snap)


def test_under_the_ratio_is_no_verdict():
    assert dead("map-2", 400).verdict(snapshot(**{"map-2": (2000, 1600)}), running=True) is None


def test_a_burst_late_in_a_long_run_is_judged_over_the_recent_tuples_not_since_the_start():
    """1,000,000 good tuples, then 60,000 of the next 100,000 dead-lettered: 5% since the start,
    60% of the recent window (dead-letters.window, 100,000): the run fails on it."""
    letters = DeadLetters()
    for seen in range(0, 1_000_001, 100_000):                  # a monitor window per 100,000 tuples
        assert letters.verdict(snapshot(**{"map-2": (seen, seen)}), running=True) is None
    for _ in range(60_000):
        letters.keep({"op": "map-2", "item": {"repr": "x"}, "error": "bad"})
    verdict = letters.verdict(snapshot(**{"map-2": (1_100_000, 1_040_000)}), running=True)
    assert verdict is not None and verdict.startswith(
        "map-2 dead-lettered 60000 of 100000 recent tuples (60%, more than pescheduler.dead-letters.max-ratio 0.5)")


def test_a_burst_the_window_has_moved_past_is_no_longer_counted():
    letters = DeadLetters()
    letters.verdict(snapshot(**{"map-2": (0, 0)}), running=True)
    for _ in range(400):
        letters.keep({"op": "map-2", "item": {"repr": "x"}, "error": "bad"})
    assert letters.verdict(snapshot(**{"map-2": (1_000, 600)}), running=True) is None     # 40%
    for seen in range(101_000, 401_001, 100_000):
        assert letters.verdict(snapshot(**{"map-2": (seen, seen - 400)}), running=True) is None
    assert letters._recent("map-2", 401_000, 400)[1] == 0, "the old burst still counted"

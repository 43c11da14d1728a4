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

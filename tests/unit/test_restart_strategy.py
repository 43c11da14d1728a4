"""The restart strategy (pescheduler/restart.py): Flink's exponential delay with a failure-rate limit.

Finding 8 of issue 31: the budget was 3 attempts for the run's whole life, 100 ms apart, never
reset, so a broker away for 4 s ended a checkpointed run 0.5 s in.
"""

from __future__ import annotations

import dask.config

from pescheduler.restart import Backoff, RestartStrategy


def strategy(attempts=5, reset_after=60.0, max_failures=100, interval=600.0) -> RestartStrategy:
    return RestartStrategy(Backoff(0.1, 2.0, 2.0), attempts, reset_after, max_failures, interval)


def pauses(s: RestartStrategy, times) -> list:
    return [s.on_failure(t) for t in times]


def test_the_pause_doubles_up_to_its_cap():
    assert [Backoff(0.1, 1.0, 2.0).delay(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_restores_in_a_row_are_counted_and_the_one_over_fails_the_run_with_its_reason():
    s = strategy(attempts=3)
    assert pauses(s, [0, 1, 2]) == [0.1, 0.2, 0.4]
    assert s.on_failure(3) is None and "3 in a row" in s.refused and "restart.attempts" in s.refused


def test_a_broker_away_for_five_seconds_is_outlasted_by_the_default_strategy():
    """Each restore fails at once while the broker is away; the pauses alone must outlast it."""
    s = RestartStrategy.of_config()
    now, waited = 0.0, 0.0
    while waited < 5.0:
        pause = s.on_failure(now)
        assert pause is not None, f"gave up after {waited:.1f} s: {s.refused}"
        now += pause
        waited += pause


def test_a_stable_period_resets_the_count_and_the_backoff():
    s = strategy(attempts=2, reset_after=10.0)
    assert pauses(s, [0, 1]) == [0.1, 0.2]
    assert s.on_failure(1.2 + 10.0) == 0.1          # up 10 s since the last restore: a fresh start
    assert s.on_failure(11.5) == 0.2
    assert s.on_failure(12.0) is None


def test_the_failure_rate_limit_fails_a_run_that_keeps_failing_after_stable_stretches():
    s = strategy(attempts=5, reset_after=1.0, max_failures=3, interval=100.0)
    assert pauses(s, [0, 10, 20]) == [0.1, 0.1, 0.1]   # each after a stable stretch
    assert s.on_failure(30) is None and "max-failures-per-interval" in s.refused
    late = strategy(attempts=5, reset_after=1.0, max_failures=3, interval=100.0)
    assert None not in pauses(late, [0, 60, 120, 180])  # the window slides: old failures drop out


def test_the_strategy_reads_its_knobs_from_pescheduler_restart():
    with dask.config.set({"pescheduler.restart.attempts": 4, "pescheduler.restart.backoff": "1s",
                          "pescheduler.restart.max-backoff": "3s", "pescheduler.restart.reset-after": "5s"}):
        s = RestartStrategy.of_config()
    assert (s.attempts, s.backoff.initial, s.backoff.cap, s.reset_after) == (4, 1.0, 3.0, 5.0)


def test_restores_in_a_row_read_zero_once_the_run_was_stable_before_any_new_failure():
    """What the live view and the dashboard show against ``attempts``: the streak as of now, so a
    run stable for ``reset-after`` shows 0 in a row although it restored before."""
    s = strategy(attempts=3, reset_after=60.0)
    pauses(s, [0, 1])
    assert s.in_a_row(2) == 2
    assert s.in_a_row(1 + 0.2 + 60) == 0 and s.streak == 2      # stable now; nothing failed since
    assert s.on_failure(100) == 0.1 and s.in_a_row(100) == 1    # a new row starts at the first pause
